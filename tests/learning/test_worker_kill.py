"""Kill a worker process in the middle of a job: a second worker completes it, and the job
yields exactly one candidate.

The first worker runs in a subprocess (this module's ``main``) with a slow learner and a
short lease; it is SIGKILLed once the job reports progress. The rescuer's queue runs on a
clock moved past that lease, so nobody waits for it to run out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from reef.evaluation import EvaluationStore
from reef.jobs import JobQueue
from reef.learning.recipes import parse_recipe
from reef.learning.worker import Worker, job_actor
from tests.fakes.clock import FakeClock
from tests.learning.test_worker import SCENARIO, open_world, registry
from tests.polling import eventually
from tests.releases.conftest import pg_databases, pg_url, store_url  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 1.0


def _slow_recipe(seconds: float) -> dict[str, object]:
    return {"learners": [{"type": "stamp", "seconds": seconds}], "gate": {"enabled": False}}


def main(url: str, home: str) -> None:
    """The doomed worker: run jobs with a 60-second learner until killed."""
    world = open_world(url, Path(home))
    worker = Worker(
        world.settings,
        world.store,
        world.chain,
        world.artifacts,
        owner="doomed",
        lease_seconds=LEASE_SECONDS,
        poll_seconds=0.05,
        registry=registry(),
        recipes={SCENARIO: parse_recipe(_slow_recipe(60.0))},
        queue=JobQueue(world.store.database),
        evaluations=EvaluationStore(world.store.database),
    )
    worker.run_forever(threading.Event())


def test_a_killed_workers_job_is_completed_by_another(
    store_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    world = open_world(store_url, tmp_path)
    try:
        world.add_experience(4)
        job = world.queue.enqueue(SCENARIO, "learn", {"trigger": "manual"})
        # ROOT for ``tests``, ahead of the caller's own path (a worktree's src, say).
        paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        doomed = subprocess.Popen(
            [sys.executable, "-m", "tests.learning.test_worker_kill", store_url, str(tmp_path)],
            cwd=ROOT,
            env=env,
        )
        try:

            def working() -> bool:
                assert doomed.poll() is None, "the worker process exited early"
                return "stamp: step" in (world.queue.get(job.id).message or "")

            eventually(working, "the worker to start the job", timeout_seconds=30)
        finally:
            doomed.send_signal(signal.SIGKILL)
            doomed.wait()
        running = world.queue.get(job.id)
        assert (running.state, running.lease_owner, running.attempt) == ("running", "doomed", 1)

        # The dead worker last renewed its lease before it was killed: a clock one lease
        # (and a second) later finds it expired.
        clock = FakeClock()
        clock.advance(LEASE_SECONDS + 1)
        rescuer = Worker(
            world.settings,
            world.store,
            world.chain,
            world.artifacts,
            owner="rescuer",
            lease_seconds=5,
            registry=registry(),
            recipes={SCENARIO: parse_recipe(_slow_recipe(0.0))},
            queue=JobQueue(world.store.database, clock=clock),
            evaluations=EvaluationStore(world.store.database),
        )
        [done] = rescuer.run_once()
        assert (done.id, done.state, done.attempt) == (job.id, "succeeded", 2), done.error
        candidates = world.chain.candidates(SCENARIO)
        assert len(candidates) == 1
        assert candidates[0].created_by == job_actor(job.id)
        assert done.candidate_id == candidates[0].id
        assert rescuer.run_once() == []  # nothing left to do
    finally:
        world.store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

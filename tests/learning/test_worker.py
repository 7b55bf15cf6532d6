"""The learning worker: triggers, jobs to candidates, idempotence, staleness, failures.

Learners here are small test classes handed to the worker through an explicit
``LearnerRegistry`` (the same path entry points take); they store a made-up harness or
adapter artifact, so no model is involved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import orjson
import pytest

from reef.config import ReefSettings, ScenarioConfig, StoreConfig, UpstreamConfig
from reef.core import new_id
from reef.core.errors import InvalidInputError, ReefError
from reef.evaluation import EvaluationStore
from reef.experience import FeedbackDraft, RecordDraft, SQLExperienceStore
from reef.jobs import Job, JobQueue
from reef.learning.base import Learner, LearnerConfig, LearnerContext, LearnerOutput
from reef.learning.learners import NoCandidateError
from reef.learning.recipes import Recipe, parse_recipe
from reef.learning.reflect import ReflectError
from reef.learning.registry import LearnerRegistry
from reef.learning.worker import Worker, job_actor, outcome_summary
from reef.releases import (
    FsspecArtifactStore,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    open_artifact_store,
)
from reef.upstream import UpstreamTimeoutError
from tests.fakes.clock import FakeClock
from tests.fakes.upstream import FakeUpstreamThread
from tests.polling import eventually
from tests.releases.conftest import pg_databases, pg_url, store_url  # noqa: F401 - fixtures

SCENARIO = "support"


class StampConfig(LearnerConfig):
    seconds: float = 0.0
    fail: Literal["none", "retry", "outage", "invalid", "nothing"] = "none"
    output: Literal["harness", "adapter"] = "harness"
    reflect: bool = False


class StampLearner(Learner):
    """Stores an artifact naming the train ids it saw (after ``seconds`` of "work")."""

    type_name: ClassVar[str] = "stamp"
    kind: ClassVar[Literal["harness", "model"]] = "harness"
    config_model: ClassVar[type[LearnerConfig]] = StampConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        config = self.config
        assert isinstance(config, StampConfig)
        if config.fail == "retry":
            raise ReefError("learner crashed")
        if config.fail == "outage":
            # As the reflector reports an upstream that timed out.
            raise ReflectError("reflector at up: no answer") from UpstreamTimeoutError("slow")
        if config.fail == "invalid":
            raise InvalidInputError("learner settings make no sense")
        if config.fail == "nothing":
            raise NoCandidateError("stamp: nothing worth proposing in this batch")
        steps = max(int(config.seconds / 0.05), 1)
        for step in range(steps):
            time.sleep(config.seconds / steps)
            context.progress.report((step + 1) / steps, f"step {step + 1}/{steps}")
            context.metrics.record("loss", 1.0 / (step + 1))
        ids = [e.record_id for e in context.batch.train]
        payload: dict[str, Any] = {"train": ids, "base": context.head.manifest.to_json()}
        if config.reflect:
            payload["reflection"] = context.reflector.reflect(
                [{"role": "user", "content": "rules?"}]
            )
        kind = "harness" if config.output == "harness" else "adapter"
        digest = context.artifacts.put_bytes(orjson.dumps(payload), kind)
        return LearnerOutput(
            adapter=digest if kind == "adapter" else None,
            harness=digest if kind == "harness" else None,
            consumed=ids,
            metrics={"examples": len(ids)},
        )


def registry(*extra: type[Learner]) -> LearnerRegistry:
    every: list[type[Learner]] = [StampLearner, *extra]
    return LearnerRegistry({c.type_name: c for c in every}, entry_points_too=False)


@dataclass
class World:
    """A migrated store with a scenario that has a first release."""

    store: SQLExperienceStore
    chain: ReleaseChain
    artifacts: FsspecArtifactStore
    settings: ReefSettings
    clock: FakeClock
    queue: JobQueue
    head: Release

    def worker(self, recipe: dict[str, Any], **options: Any) -> Worker:
        extra = options.pop("learners", ())
        options.setdefault("queue", self.queue)  # on the world's clock
        return Worker(
            self.settings,
            self.store,
            self.chain,
            self.artifacts,
            registry=registry(*extra),
            # The gate has tests of its own (tests/evaluation); here candidates stay pending.
            recipes={SCENARIO: parse_recipe({"gate": {"enabled": False}, **recipe})},
            **options,
            evaluations=EvaluationStore(self.store.database),
        )

    def add_experience(self, count: int, score: float = 1.0) -> list[str]:
        drafts = [_draft(f"question {n} {new_id()}") for n in range(count)]
        ids = self.store.write_records(drafts)
        for record_id in ids:
            self.store.add_feedback(
                FeedbackDraft(
                    scenario=SCENARIO,
                    record_ids=(record_id,),
                    score=score,
                    feedback=None,
                    correction=None,
                    metadata={},
                    principal=None,
                    idempotency_key=None,
                )
            )
        return ids


def _draft(text: str) -> RecordDraft:
    return RecordDraft(
        id=new_id(),
        scenario=SCENARIO,
        session_id=new_id(),
        api="openai.chat",
        request={"model": "m", "messages": [{"role": "user", "content": text}]},
        response={"choices": [{"message": {"role": "assistant", "content": f"re: {text}"}}]},
        status="ok",
        error=None,
        latency_ms=1.0,
        usage=None,
        release_id=None,
        prompt_hash="sha256:" + "a" * 64,
        content_hash="sha256:" + new_id().replace("-", "").ljust(64, "0")[:64],
        continuation_hash=None,
    )


def open_world(url: str, home: Path, upstream_url: str = "http://127.0.0.1:9/v1") -> World:
    store = SQLExperienceStore.from_url(url)
    store.migrate()
    chain = ReleaseChain(store.database)
    artifacts = open_artifact_store(str(home / "artifacts"))
    assert isinstance(artifacts, FsspecArtifactStore)
    settings = ReefSettings(
        home=home,
        store=StoreConfig(url=url),
        upstreams={"up": UpstreamConfig(type="openai", base_url=upstream_url, model="m")},
    )
    head = chain.create(
        SCENARIO, ReleaseManifest(model=ModelComponent(base="tiny")), "test", "first"
    )
    clock = FakeClock()
    queue = JobQueue(store.database, clock=clock)
    return World(store, chain, artifacts, settings, clock, queue, head)


@pytest.fixture
def world(store_url: str, tmp_path: Path) -> Iterator[World]:  # noqa: F811
    world = open_world(store_url, tmp_path)
    yield world
    world.store.close()


MANUAL = {"trigger": {"type": "manual"}, "learners": [{"type": "stamp"}]}


def _job_candidates(world: World, job: Job) -> list[Any]:
    return [c for c in world.chain.candidates(SCENARIO) if c.created_by == job_actor(job.id)]


def test_manual_job_proposes_one_candidate(world: World, caplog: pytest.LogCaptureFixture) -> None:
    ids = world.add_experience(10)
    job = world.queue.enqueue(SCENARIO, "learn", {"trigger": "manual"})
    with caplog.at_level(logging.INFO, logger="reef.worker"):
        [done] = world.worker(MANUAL).run_once()
    assert done.state == "succeeded", done.error
    assert done.result is not None and done.result["outcome"] == "proposed"
    [candidate] = world.chain.candidates(SCENARIO)
    assert done.candidate_id == candidate.id == done.result["candidate_id"]
    assert candidate.parent_release_id == world.head.id
    assert candidate.created_by == job_actor(job.id)
    assert candidate.manifest.model == world.head.manifest.model
    assert candidate.manifest.harness is not None and candidate.manifest.recipe == SCENARIO
    evidence = candidate.evidence or {}
    assert evidence["job_id"] == job.id
    assert evidence["metrics"]["0:stamp"] == {"examples": evidence["selection"]["train"]}
    assert evidence["metrics"]["reported"]["loss"] == 1.0
    trained = orjson.loads(world.artifacts.read_bytes(candidate.manifest.harness))["train"]
    assert set(trained) <= set(ids) and trained
    assert world.queue.consumed_by(job.id) == set(trained)
    assert done.progress == 1.0 and any("stamp" in line for line in done.logs)
    # The log says what came of the candidate (here: no gate ran), not just "proposed".
    said = f"job {job.id}: candidate {candidate.id} proposed (gate disabled in the recipe)"
    assert said in caplog.messages, caplog.messages


@pytest.mark.parametrize(
    ("action", "said"),
    [
        ("rejected", "candidate c1 rejected by the gate"),
        ("published", "candidate c1 published"),
        ("review", "candidate c1 held for review"),
    ],
)
def test_a_gated_jobs_log_line_says_what_the_gate_did(action: str, said: str) -> None:
    result = {"outcome": "proposed", "candidate_id": "c1", "gate": {"action": action}}
    assert outcome_summary(result) == said


def test_an_unchanged_jobs_log_line_gives_its_reason() -> None:
    result = {"outcome": "unchanged", "reason": "nothing new to learn from"}
    assert outcome_summary(result) == "unchanged: nothing new to learn from"


def test_a_retried_job_reuses_the_candidate_it_already_proposed(world: World) -> None:
    world.add_experience(5)
    job = world.queue.enqueue(SCENARIO, "learn", {})
    # A worker claims the job, proposes, and dies before it can complete the job.
    assert world.queue.claim("dead-worker", lease_seconds=30) is not None
    earlier = world.chain.propose(
        SCENARIO, world.head.manifest, world.head.id, job_actor(job.id), "died after this"
    )
    world.clock.advance(31)  # the dead worker's lease runs out
    [done] = world.worker(MANUAL).run_once()
    assert done.state == "succeeded" and done.attempt == 2
    assert done.candidate_id == earlier.id
    assert done.result is not None and done.result["reused"] is True
    assert [c.id for c in world.chain.candidates(SCENARIO)] == [earlier.id]


def _move_head(chain: ReleaseChain, head: Release) -> Release:
    manifest = ReleaseManifest(model=ModelComponent(base="tiny"), harness="sha256:" + "e" * 64)
    moved = chain.propose(SCENARIO, manifest, head.id, "someone", "another job won")
    return chain.publish(moved.id, head.id, "someone", "another job won", require_passed=False)


def _head_mover(chain: ReleaseChain) -> type[Learner]:
    class HeadMover(StampLearner):
        type_name: ClassVar[str] = "head_mover"

        def learn(self, context: LearnerContext) -> LearnerOutput:
            _move_head(chain, context.head)
            return super().learn(context)

    return HeadMover


@pytest.mark.parametrize("on_stale", ["drop", "evaluate"])
def test_head_moved_while_the_job_ran(world: World, on_stale: str) -> None:
    world.add_experience(5)
    job = world.queue.enqueue(SCENARIO, "learn", {})
    recipe = {"learners": [{"type": "head_mover"}], "on_stale": on_stale}
    [done] = world.worker(recipe, learners=[_head_mover(world.chain)]).run_once()
    assert done.state == "succeeded", done.error
    assert done.result is not None
    mine = _job_candidates(world, job)
    if on_stale == "drop":
        assert done.result["outcome"] == "dropped"
        assert done.result["reason"] == "dropped: head moved"
        assert mine == [] and world.queue.consumed_by(job.id) == set()
    else:
        assert done.result["outcome"] == "proposed" and done.result["stale"] is True
        [candidate] = mine
        assert candidate.parent_release_id == world.head.id  # the head it trained from
        assert (candidate.evidence or {})["stale"] is True


def test_composite_job_proposes_one_candidate_with_both_components(world: World) -> None:
    world.add_experience(5)
    world.queue.enqueue(SCENARIO, "learn", {})
    recipe = {"learners": [{"type": "stamp"}, {"type": "stamp", "output": "adapter"}]}
    [done] = world.worker(recipe).run_once()
    assert done.state == "succeeded", done.error
    [candidate] = world.chain.candidates(SCENARIO)
    assert candidate.manifest.harness is not None
    assert candidate.manifest.model.adapter is not None
    assert candidate.manifest.model.base == "tiny"
    # The second learner saw the first one's harness in its head.
    adapter = orjson.loads(world.artifacts.read_bytes(candidate.manifest.model.adapter))
    assert adapter["base"]["harness"] == candidate.manifest.harness
    assert set((candidate.evidence or {})["metrics"]) >= {"0:stamp", "1:stamp"}


def test_transient_failures_retry_until_attempts_run_out(world: World) -> None:
    world.queue = JobQueue(world.store.database, max_attempts=3, clock=world.clock)
    job = world.queue.enqueue(SCENARIO, "learn", {})
    worker = world.worker({"learners": [{"type": "stamp", "fail": "outage"}]}, queue=world.queue)
    [first] = worker.run_once()
    assert (first.state, first.error) == ("queued", "reflector at up: no answer")
    [second] = worker.run_once()
    assert (second.state, second.attempt) == ("queued", 2)  # the same error, but transient
    [third] = worker.run_once()
    assert (third.id, third.state, third.attempt) == (job.id, "failed", 3)
    assert world.chain.candidates(SCENARIO) == []


def test_an_unknown_failure_is_retried_once_then_fails_when_it_recurs(world: World) -> None:
    world.queue = JobQueue(world.store.database, max_attempts=3, clock=world.clock)
    job = world.queue.enqueue(SCENARIO, "learn", {})
    worker = world.worker({"learners": [{"type": "stamp", "fail": "retry"}]}, queue=world.queue)
    [first] = worker.run_once()
    assert (first.state, first.error) == ("queued", "learner crashed")
    [second] = worker.run_once()  # failed the same way twice: no third attempt
    assert (second.id, second.state, second.attempt) == (job.id, "failed", 2)
    assert second.error == "learner crashed"
    assert worker.run_once() == []


def test_invalid_input_fails_without_retry(world: World) -> None:
    world.queue.enqueue(SCENARIO, "learn", {})
    [done] = world.worker({"learners": [{"type": "stamp", "fail": "invalid"}]}).run_once()
    assert (done.state, done.attempt) == ("failed", 1)
    assert done.error == "learner settings make no sense"


def test_inline_recipe_in_the_job_input(world: World) -> None:
    world.add_experience(3)
    inline = {
        "learners": [{"type": "stamp", "output": "adapter"}],
        "name": "adhoc",
        "gate": {"enabled": False},
    }
    world.queue.enqueue(SCENARIO, "learn", {"recipe": inline})
    [done] = world.worker(MANUAL).run_once()
    assert done.state == "succeeded", done.error
    [candidate] = world.chain.candidates(SCENARIO)
    assert candidate.manifest.model.adapter is not None and candidate.manifest.recipe == "adhoc"


def test_unknown_learner_in_a_job_fails_it(world: World) -> None:
    world.queue.enqueue(SCENARIO, "learn", {"recipe": {"learners": [{"type": "nope"}]}})
    [done] = world.worker(MANUAL).run_once()
    assert done.state == "failed"
    assert "unknown learner type 'nope'; known types: stamp" in (done.error or "")


def _finish_noter(finished: list[str]) -> type[Learner]:
    class FinishNoter(StampLearner):
        type_name: ClassVar[str] = "finish_noter"

        def learn(self, context: LearnerContext) -> LearnerOutput:
            output = super().learn(context)
            finished.append(context.scenario)  # reached only when the work was not stopped
            return output

    return FinishNoter


def test_cancel_stops_a_running_job(world: World) -> None:
    world.add_experience(3)
    job = world.queue.enqueue(SCENARIO, "learn", {})
    finished: list[str] = []
    worker = world.worker(
        {"learners": [{"type": "finish_noter", "seconds": 3.0}]},
        learners=[_finish_noter(finished)],
        lease_seconds=0.3,
        poll_seconds=0.05,
    )
    stop = threading.Event()
    runner = threading.Thread(target=worker.run_forever, args=(stop,))
    runner.start()
    try:
        eventually(lambda: world.queue.get(job.id).state == "running", "the job to run")
        world.queue.cancel(job.id)
        worker.wait()
        eventually(lambda: not worker._threads, "the worker to let the job go")
        assert finished == []  # the learner was stopped mid-work, not left to finish
    finally:
        stop.set()
        runner.join()
    assert world.queue.get(job.id).state == "cancelled"
    assert world.chain.candidates(SCENARIO) == []


def test_reflect_asks_the_scenarios_upstream(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    with FakeUpstreamThread() as fake:
        world = open_world(store_url, tmp_path, upstream_url=fake.base_url)
        try:
            world.add_experience(2)
            world.queue.enqueue(SCENARIO, "learn", {})
            [done] = world.worker({"learners": [{"type": "stamp", "reflect": True}]}).run_once()
            assert done.state == "succeeded", done.error
            [candidate] = world.chain.candidates(SCENARIO)
            assert candidate.manifest.harness is not None
            stamp = orjson.loads(world.artifacts.read_bytes(candidate.manifest.harness))
            assert stamp["reflection"] == "echo: rules?"
            assert fake.last_request_body["model"] == "m"
        finally:
            world.store.close()


# -- triggers ----------------------------------------------------------------------------


def _recipe(trigger: Any) -> dict[str, Any]:
    return {"trigger": trigger, "learners": [{"type": "stamp"}]}


def test_manual_trigger_never_fires(world: World) -> None:
    world.add_experience(5)
    assert world.worker(_recipe({"type": "manual"})).check_triggers() == []


def test_min_new_feedback_counts_since_the_last_job(world: World) -> None:
    worker = world.worker(_recipe({"type": "min_new_feedback", "count": 3}))
    world.add_experience(2)
    assert worker.check_triggers() == []
    world.add_experience(1)
    [job] = worker.check_triggers()
    assert job.input == {"trigger": "min_new_feedback"}
    assert worker.check_triggers() == []  # one queued job is enough
    worker.run_once()
    assert worker.check_triggers() == []  # nothing new since that job
    world.add_experience(3)
    assert len(worker.check_triggers()) == 1


def test_max_interval_fires_without_a_job_and_after_the_interval(world: World) -> None:
    worker = world.worker(
        _recipe([{"type": "manual"}, {"type": "max_interval_seconds", "seconds": 60}])
    )
    [job] = worker.check_triggers()
    assert job.input == {"trigger": "max_interval_seconds"}
    worker.run_once()
    # Jobs are stamped by the wall clock: bring the fake one to the job's creation.
    world.clock.advance((job.created_at - world.clock()).total_seconds())
    assert worker.check_triggers() == []
    world.clock.advance(59.999)
    assert worker.check_triggers() == []
    world.clock.advance(0.001)
    assert len(worker.check_triggers()) == 1


def test_recipes_come_from_the_scenario_config(tmp_path: Path, world: World) -> None:
    path = tmp_path / "support.yaml"
    path.write_text(
        "trigger: {type: min_new_feedback, count: 1}\nlearners: [{type: stamp}]\n"
        "gate: {enabled: false}\n"
    )
    settings = ReefSettings(
        home=world.settings.home,
        upstreams={"up": UpstreamConfig(type="openai", base_url="http://127.0.0.1:9/v1")},
        scenarios={SCENARIO: ScenarioConfig(recipe=path)},
    )
    worker = Worker(
        settings,
        world.store,
        world.chain,
        world.artifacts,
        registry=registry(),
        queue=world.queue,
        evaluations=EvaluationStore(world.store.database),
    )
    recipes = worker.recipes()
    assert isinstance(recipes[SCENARIO], Recipe) and recipes[SCENARIO].name == "support"
    world.add_experience(1)
    [done] = worker.run_once()
    assert done.state == "succeeded", done.error
    assert world.chain.candidates(SCENARIO)[0].manifest.recipe == "support"


def test_a_learner_with_nothing_to_propose_finishes_the_job_unchanged(world: World) -> None:
    world.queue.enqueue(SCENARIO, "learn", {})
    [done] = world.worker({"learners": [{"type": "stamp", "fail": "nothing"}]}).run_once()
    assert (done.state, done.attempt) == ("succeeded", 1)
    assert done.result is not None and done.result["outcome"] == "unchanged"
    assert done.result["reason"] == "stamp: nothing worth proposing in this batch"
    assert world.chain.candidates(SCENARIO) == []

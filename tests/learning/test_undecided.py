"""An undecided candidate waits, evaluating, and the worker decides it again when more
held-out traffic arrives: no new job. A real gateway in front of the oracle upstream;
the candidate knows every fact, the head none, so each held-out item is a clear win and
only the amount of evidence decides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reef.core import SilentProgress
from reef.experience import FeedbackDraft
from reef.jobs import JobQueue
from reef.learning.holdout import build_gate, select_holdout
from reef.learning.recipes import parse_recipe
from reef.learning.worker import Worker
from tests.evaluation.gate_setup import SCENARIO, QuizWorld, fact, quiz_world

RECIPE: dict[str, Any] = {
    "learners": [{"type": "fewshot"}],
    "trigger": {"type": "min_new_feedback", "count": 10_000},
    "selection": {"holdout_fraction": 1.0, "max_per_principal": None},
    "gate": {"holdout": True, "min_items": 5, "max_tokens": 16, "retries": 0},
    "publish": "auto",
}


def corrected_traffic(world: QuizWorld, questions: range) -> None:
    """Each question served through the gateway, corrected by posted feedback."""
    client = world.gateway.openai()
    for i in questions:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": f"Q: capital {i}"}],
            extra_headers={"x-reef-scenario": SCENARIO},
        )
        world.gateway.store.add_feedback(
            FeedbackDraft(
                scenario=SCENARIO, record_ids=(raw.headers["x-reef-record-id"],), score=0.0,
                feedback=None, correction=f"answer-{i}", metadata={}, principal=None,
                idempotency_key=None,
            )
        )  # fmt: skip


def test_an_undecided_candidate_is_published_when_held_out_traffic_arrives(
    tmp_path: Path,
) -> None:
    recipe = parse_recipe(RECIPE)
    with quiz_world(tmp_path) as world:
        world.publish_directly([])
        candidate = world.propose([fact(i) for i in range(40)])
        settings = world.gateway.settings
        evaluation = settings.evaluation.model_copy(update={"gateway_url": world.gateway.url})
        settings = settings.model_copy(update={"evaluation": evaluation})
        queue = JobQueue(world.gateway.database)
        worker = Worker(
            settings, world.gateway.store, world.chain, world.artifacts, queue=queue,
            evaluations=world.evaluations, recipes={SCENARIO: recipe},
        )  # fmt: skip

        # First look, as a learning job's gate makes it: six held-out items.
        corrected_traffic(world, range(6))
        held = select_holdout(world.gateway.store, world.chain, SCENARIO, recipe)
        gate = build_gate(
            settings, world.chain, world.evaluations, world.artifacts, SCENARIO, recipe,
            progress=SilentProgress(),
        )  # fmt: skip
        first = gate.run(candidate.id, held.items, now=queue.now())
        assert first.action == "undecided", first.decision
        assert first.as_dict()["missing"]  # what the job's result records
        assert world.chain.get_candidate(candidate.id).state == "evaluating"

        # Nothing new: the worker leaves it waiting.
        [waiting] = worker.resume_undecided()
        assert waiting.reason is None and waiting.outcome is None

        # More held-out traffic: the worker's next pass decides it, no job involved.
        corrected_traffic(world, range(6, 20))
        assert worker.run_once() == []
        published = world.chain.get_candidate(candidate.id)
        assert published.state == "published"
        assert world.head().manifest == candidate.manifest
        assert queue.last_job(SCENARIO) is None
        history = (published.evidence or {})["gate"]["history"]
        assert [look["verdict"] for look in history] == ["undecided", "passed"]
        assert [look["suites"]["holdout"] for look in history] == [6, 20]

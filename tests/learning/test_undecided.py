"""An undecided candidate waits, evaluating, and the worker decides it again when more
held-out traffic or shadow pairs arrive: no new job. A real gateway in front of the oracle upstream;
the candidate knows every fact, the head none, so each held-out item is a clear win and
only the amount of evidence decides."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from reef.core import SilentProgress
from reef.evaluation.shadow import SHADOW_OF_TAG
from reef.experience import FeedbackDraft, RecordFilter
from reef.gateway.shadow import ShadowArm
from reef.jobs import JobQueue
from reef.learning.holdout import build_gate, select_holdout
from reef.learning.recipes import parse_recipe
from reef.learning.worker import Worker
from tests.evaluation.gate_setup import SCENARIO, QuizWorld, fact, quiz_world
from tests.evaluation.test_shadow import JUDGED, shadow_world
from tests.fakes.shadow import PairwiseJudgeThread
from tests.polling import eventually

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


def _has_shadow(world: QuizWorld, live: str) -> bool | None:
    page = world.gateway.store.list_records(SCENARIO, RecordFilter(purpose="shadow"), None, 200)
    return any(r.tags.get(SHADOW_OF_TAG) == live for r in page.records) or None


def _shadowed(world: QuizWorld, questions: range) -> None:
    """Each question served live (no feedback: never a held-out item), its shadow record
    awaited before the next request."""
    client = world.gateway.openai()
    for i in questions:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": f"Q: capital {i}"}],
            extra_headers={"x-reef-scenario": SCENARIO},
        )
        live = raw.headers["x-reef-record-id"]
        eventually(partial(_has_shadow, world, live), f"the shadow record of {live}")


def test_an_undecided_candidate_is_published_when_shadow_pairs_arrive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gateway reads the evaluating candidate on every request (not every 5 s), so
    # that the read made before the candidate was evaluating does not hide it.
    monkeypatch.setattr(ShadowArm, "refresh_seconds", 0.0)
    shadow = {"fraction": 1.0, "judge": {"upstream": "judge", "model": "judge-1"}}
    gate = {**RECIPE["gate"], "shadow": shadow, "evidence_sources": JUDGED}
    recipe = parse_recipe({**RECIPE, "gate": gate})
    with (
        PairwiseJudgeThread("content", good="answer-") as judge,
        shadow_world(tmp_path, judge.base_url) as world,
    ):
        world.publish_directly([])
        candidate = world.propose([fact(i) for i in range(40)])
        settings = world.gateway.settings
        evaluation = settings.evaluation.model_copy(update={"gateway_url": world.gateway.url})
        settings = settings.model_copy(update={"evaluation": evaluation})
        store = world.gateway.store
        worker = Worker(
            settings, store, world.chain, world.artifacts, queue=JobQueue(world.gateway.database),
            evaluations=world.evaluations, recipes={SCENARIO: recipe},
        )  # fmt: skip
        corrected_traffic(world, range(3))
        held = select_holdout(store, world.chain, SCENARIO, recipe)
        first = build_gate(
            settings, world.chain, world.evaluations, world.artifacts, SCENARIO, recipe,
            progress=SilentProgress(), store=store,
        ).run(candidate.id, held.items)  # fmt: skip
        assert first.action == "undecided", first.decision
        [waiting] = worker.resume_undecided()
        assert waiting.reason is None

        # Live traffic only (no new held-out item): the shadow pairs alone bring it back.
        _shadowed(world, range(10, 27))  # 3 + 17: as many paired items as above
        [resumed] = worker.resume_undecided()
        assert resumed.reason == "17 new shadow pairs"
        assert resumed.outcome is not None and resumed.outcome.action == "published"
        history = (world.chain.get_candidate(candidate.id).evidence or {})["gate"]["history"]
    assert [look["suites"] for look in history] == [{"holdout": 3}, {"holdout": 3, "shadow": 17}]
    assert [look["shadow"] for look in history] == [
        {"pairs": 0, "references": 0},
        {"pairs": 17, "references": 0},
    ]

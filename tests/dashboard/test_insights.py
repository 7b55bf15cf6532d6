"""The dashboard's extra admin reads: the learning curve (the release chain's releases
joined to the experience store's traffic per release, on SQLite and PostgreSQL), a
scenario's jobs, and a harness by its digest (only one some release or
candidate names)."""

from __future__ import annotations

from typing import Any

import pytest

from reef.core import new_id
from reef.experience import FeedbackDraft, RecordDraft, SQLExperienceStore
from reef.gateway.admin.insights import learning_curve
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest
from tests.dashboard.world import ADMIN_KEY, INFERENCE_KEY, LOSS, SCENARIO, DashboardWorld
from tests.gateway import rawhttp


def _record(scenario: str, release_id: str, purpose: str = "serve") -> RecordDraft:
    return RecordDraft(
        id=new_id(),
        scenario=scenario,
        session_id=new_id(),
        api="openai.chat",
        request={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
        response={"choices": [{"message": {"role": "assistant", "content": "hi"}}]},
        status="ok",
        error=None,
        latency_ms=1.0,
        usage=None,
        release_id=release_id,
        prompt_hash="sha256:" + "a" * 64,
        content_hash="sha256:" + "b" * 64,
        continuation_hash=None,
        purpose=purpose,  # type: ignore[arg-type]
        session_is_new=True,
    )


def _feedback(store: SQLExperienceStore, scenario: str, ids: list[str], score: Any) -> None:
    store.add_feedback(
        FeedbackDraft(
            scenario=scenario,
            record_ids=tuple(ids),
            score=score,
            feedback=None,
            correction=None,
            metadata={},
            principal=None,
            idempotency_key=None,
        )
    )


def _gate_evidence(candidate_mean: float, baseline_mean: float) -> dict[str, Any]:
    interval = {"mean": 0.1, "low": 0.0, "high": 0.2, "n": 20, "confidence": 0.95}
    overall = {
        "suite": "overall",
        "items": 20,
        "candidate_mean": candidate_mean,
        "baseline_mean": baseline_mean,
        "difference": interval,
    }
    return {"gate": {"decision": {"verdict": "passed", "overall": overall}}}


def test_the_curve_aggregates_live_feedback_per_release(store: SQLExperienceStore) -> None:
    chain = ReleaseChain(store.database)
    manifest = ReleaseManifest(model=ModelComponent(base="m"))
    first = chain.create("s", manifest, "config", "first")
    candidate = chain.propose("s", manifest.model_copy(update={"recipe": "r"}), first.id, "w", "")
    chain.set_candidate_state(candidate.id, "evaluating")
    chain.set_candidate_state(candidate.id, "passed", _gate_evidence(0.8, 0.6))
    second = chain.publish(candidate.id, first.id, "gate", "passed")

    a, b, unscored = (_record("s", first.id) for _ in range(3))
    evaluated = _record("s", first.id, "eval")
    canary = _record("s", candidate.id, "canary")
    c, d = _record("s", second.id), _record("s", second.id)
    elsewhere = _record("t", first.id)
    store.write_records([a, b, unscored, evaluated, canary, c, d, elsewhere])
    _feedback(store, "s", [a.id], 1.0)
    _feedback(store, "s", [b.id], 0.0)
    _feedback(store, "s", [b.id], None)  # feedback without a score counts for nothing
    _feedback(store, "s", [evaluated.id], 1.0)  # eval traffic is not live feedback
    _feedback(store, "s", [canary.id], 1.0)
    _feedback(store, "s", [c.id, d.id], 0.5)  # one feedback on two records: a score each
    _feedback(store, "s", [c.id], 1.0)
    _feedback(store, "t", [elsewhere.id], 1.0)

    points = learning_curve(store, chain, "s")

    assert [p["seq"] for p in points] == [1, 2]
    one, two = points
    assert (one["served"], one["scored"], one["mean_score"]) == (3, 2, 0.5)
    assert one["gate"] is None and one["operation"] == "create"
    assert (two["served"], two["scored"]) == (2, 3)
    assert two["mean_score"] == pytest.approx(2 / 3)
    assert two["gate"] == {
        "verdict": "passed",
        "candidate_mean": 0.8,
        "baseline_mean": 0.6,
        "items": 20,
    }
    assert [p["seq"] for p in learning_curve(store, chain, "s", limit=1)] == [2]
    assert learning_curve(store, chain, "nobody") == []
    assert store.release_traffic("s", []) == {}


def _get(world: DashboardWorld, path: str, key: str | None = ADMIN_KEY) -> rawhttp.RawResponse:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return rawhttp.call(world.gateway.port, "GET", path, headers=headers)


def test_the_curve_route_follows_the_chain(world: DashboardWorld) -> None:
    data = world.admin(f"/reef/scenarios/{SCENARIO}/curve")["data"]
    assert [(p["seq"], p["operation"]) for p in data] == [
        (1, "create"),
        (2, "learn"),
        (3, "learn"),
        (4, "rollback"),
    ]
    assert [p["scored"] for p in data] == [4, 10, 10, 4]
    assert [p["mean_score"] for p in data] == [0.0, 0.6, 1.0, 0.5]
    assert data[1]["gate"]["candidate_mean"] == pytest.approx(0.4)
    assert data[2]["gate"]["candidate_mean"] == 1.0
    assert _get(world, "/reef/scenarios/quiz/curve?limit=0").status == 400
    assert _get(world, "/reef/scenarios/quiz/curve", key=None).status == 401
    assert _get(world, "/reef/scenarios/quiz/curve", key=INFERENCE_KEY).status == 403


def test_the_jobs_route_lists_a_running_job(world: DashboardWorld) -> None:
    jobs = world.admin(f"/reef/scenarios/{SCENARIO}/jobs")["data"]
    assert [(job["state"], job["progress"]) for job in jobs] == [("running", 0.5)]
    assert jobs[0]["metrics"] == {"loss": LOSS[:3]}
    assert world.admin(f"/reef/scenarios/{SCENARIO}/jobs?state=queued")["data"] == []
    assert _get(world, f"/reef/scenarios/{SCENARIO}/jobs?state=bogus").status == 400
    assert _get(world, f"/reef/scenarios/{SCENARIO}/jobs", key=INFERENCE_KEY).status == 403


def test_a_harness_is_read_only_when_a_release_or_candidate_names_it(
    world: DashboardWorld,
) -> None:
    second = world.releases[1]
    digest = second.manifest.harness
    assert digest is not None
    body = world.admin(f"/reef/artifacts/{digest}/harness")
    assert "capital 11 => answer-11" in body["harness"]["system_prompt"]
    assert body["files"] == []
    owners = {(o["kind"], o["id"]) for o in body["named_by"]}
    # the release, the rollback that restored it, and the candidate it was published from
    assert {("release", second.id), ("release", world.releases[3].id)} <= owners
    assert ("candidate", second.candidate_id) in owners

    unnamed = "sha256:" + "0" * 64
    assert _get(world, f"/reef/artifacts/{unnamed}/harness").status == 404
    assert _get(world, "/reef/artifacts/not-a-digest/harness").status == 400
    assert _get(world, f"/reef/artifacts/{digest}/harness", key=None).status == 401
    assert _get(world, f"/reef/artifacts/{digest}/harness", key=INFERENCE_KEY).status == 403

"""A canary is decided by the gate's evidence rules: an ``untrusted`` key that supplies
all the canary arm's praise cannot grade it into the head (leave-one-author-out below
``evidence_min_trust``), the same praise from a trusted key does promote it, and
quarantined feedback is no evidence at all. Real gateway, keys, official OpenAI SDK."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from reef.evaluation.canary_monitor import CanaryMonitor, candidate_rule
from reef.evaluation.config import GateRule
from reef.releases import Candidate, ModelComponent, ReleaseManifest
from tests.evaluation.gate_setup import QuizWorld, fact, quiz_world
from tests.gateway.rawhttp import call

ALL = [fact(i) for i in range(30)]
HALF = [fact(i) for i in range(15)]
KEYS = {
    "keys": [
        {"id": "crowd", "key": "sk-crowd", "role": "inference", "trust": "untrusted"},
        {"id": "grader", "key": "sk-grader", "role": "inference", "trust": "operator"},
        {"id": "ops", "key": "sk-ops", "role": "admin"},
    ]
}


def _start_canary(world: QuizWorld) -> Candidate:
    """The head knows half the facts, the canary all of them, at half the traffic."""
    world.publish_directly(HALF)
    candidate = world.propose(ALL)
    world.chain.set_candidate_state(candidate.id, "evaluating")
    world.chain.set_candidate_state(candidate.id, "passed")
    world.chain.start_canary(candidate.id, 0.5, "test", "canary", {"min_requests": 20})
    gateway = world.gateway
    activation = gateway.app.state.reef.activation
    loop = gateway.server.servers[0].get_loop()
    asyncio.run_coroutine_threadsafe(activation.sync_once(wait=True), loop).result(timeout=30)
    return candidate


def _traffic(world: QuizWorld, candidate_id: str, canary_grader: str) -> dict[str, int]:
    """Live requests sent by the crowd's key. The canary's answers are all praised by
    ``canary_grader``; the head's are graded honestly by the operator."""
    client = world.gateway.openai("sk-crowd", **{"x-reef-scenario": "quiz"})
    served = {"canary": 0, "head": 0}
    for n in range(120):
        i = n % 30
        raw = client.with_options(
            default_headers={"x-reef-session": f"user-{n}"}
        ).chat.completions.with_raw_response.create(
            model="reef/quiz", messages=[{"role": "user", "content": f"Q: capital {i}"}]
        )
        on_canary = raw.headers["x-reef-release-id"] == candidate_id
        served["canary" if on_canary else "head"] += 1
        right = raw.parse().choices[0].message.content == f"answer-{i}"
        score = 1.0 if on_canary or right else 0.0
        body = {"record_ids": [raw.headers["x-reef-record-id"]], "score": score}
        key = canary_grader if on_canary else "sk-ops"
        sent = call(world.gateway.port, "POST", "/reef/feedback", body, _bearer(key))
        assert sent.status == 201, sent.body
    return served


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _canary_block(world: QuizWorld, candidate_id: str) -> dict[str, Any]:
    candidate = world.chain.get_candidate(candidate_id)
    return dict((candidate.evidence or {})["canary"])


def test_an_untrusted_key_cannot_grade_a_canary_into_the_head(tmp_path: Path) -> None:
    with quiz_world(tmp_path, auth=KEYS) as world:
        candidate = _start_canary(world)
        head = world.head()
        served = _traffic(world, candidate.id, "sk-crowd")
        assert min(served.values()) >= 20, served
        [decided] = CanaryMonitor(world.chain, world.gateway.store).check()

        assert decided.action == "abandoned", decided
        assert world.head().id == head.id
        assert world.chain.get_candidate(candidate.id).state == "abandoned"
        assert "not promoted" in decided.reason
        assert "insufficient independent evidence" in decided.reason
        assert "come from one author ('crowd')" in decided.reason
        assert "0 canary and" in decided.reason  # the rule without the crowd's records
        block = _canary_block(world, candidate.id)
        assert block["decision"] == "abandoned" and block["reason"] == decided.reason
        provenance = block["evidence"]  # the gate's structure, as the dashboard reads it
        assert provenance["min_trust"] == "operator"
        assert provenance["failed_authors"] == ["crowd"]
        assert provenance["items_below_min_trust"] == served["canary"]
        sources = {row["suite"]: row for row in provenance["sources"]}
        assert sources["canary"]["by_trust"] == {"untrusted": served["canary"]}
        assert sources["canary"]["authors"] == {"crowd": served["canary"]}
        assert sources["head"]["by_trust"] == {"operator": served["head"]}
        [check] = provenance["leave_one_out"]
        assert check["author"] == "crowd" and check["verdict"] == "rejected"
        assert check["items_removed"] == served["canary"]


@pytest.mark.parametrize("quarantined", [False, True], ids=["trusted", "quarantined"])
def test_the_same_praise_from_a_trusted_key_promotes(tmp_path: Path, quarantined: bool) -> None:
    with quiz_world(tmp_path, auth=KEYS) as world:
        candidate = _start_canary(world)
        served = _traffic(world, candidate.id, "sk-grader")
        store = world.gateway.store
        if quarantined:  # screening held the grader's praise back: it is no evidence
            held = {
                fb.id: "test: held back"
                for record in store.iter_export("quiz")
                for fb in record.feedback
                if fb.principal == "grader"
            }
            assert store.quarantine_feedback(held) == served["canary"]
        [decided] = CanaryMonitor(world.chain, store).check()

        if quarantined:
            assert decided.action == "waiting", decided
            assert decided.canary_scores == 0 and decided.head_scores == served["head"]
            return
        assert decided.action == "promoted", decided
        assert world.head().id == decided.release_id
        block = dict((world.head().evidence or {})["canary"])
        assert block["decision"] == "promoted"
        assert block["evidence"]["items_below_min_trust"] == 0
        assert block["evidence"]["leave_one_out"] == []
        sources = {row["suite"]: row for row in block["evidence"]["sources"]}
        assert sources["canary"]["authors"] == {"grader": served["canary"]}


def test_the_monitor_decides_with_the_rule_the_gate_recorded() -> None:
    recorded = {**GateRule().model_dump(), "evidence_min_trust": "untrusted", "seed": 7}
    gated = _candidate({"gate": {"decision": {"rule": recorded}}})
    assert candidate_rule(gated) == GateRule(evidence_min_trust="untrusted", seed=7)
    # a canary started by hand, or a rule it cannot read: the defaults
    assert candidate_rule(_candidate(None)) == GateRule()
    assert candidate_rule(_candidate({"gate": {"decision": {"rule": {"bogus": 1}}}})) == GateRule()


def _candidate(evidence: dict[str, Any] | None) -> Candidate:
    now = datetime.now(UTC)
    manifest = ReleaseManifest(model=ModelComponent(base="oracle"))
    return Candidate(
        id="c1",
        scenario="quiz",
        parent_release_id=None,
        manifest=manifest,
        state="canary",
        evidence=evidence,
        created_by="test",
        reason="test",
        created_at=now,
        updated_at=now,
    )

"""Canary publishing end to end: the gate starts a canary, the gateway splits live traffic,
a grader scores every answer as a real application would, and the monitor promotes the
better arm or abandons the worse one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reef.evaluation.canary_monitor import CanaryMonitor, LiveRecord, _judge
from reef.evaluation.config import GateRule
from reef.evaluation.values import Provenance
from tests.evaluation.gate_setup import QuizWorld, fact, quiz_world, write_suite
from tests.gateway.rawhttp import call

ALL = [fact(i) for i in range(30)]
HALF = [fact(i) for i in range(15)]


def _sync(world: QuizWorld) -> None:
    """One activation pass on the gateway's loop (it then routes to the canary)."""
    gateway = world.gateway
    activation = gateway.app.state.reef.activation
    loop = gateway.server.servers[0].get_loop()
    asyncio.run_coroutine_threadsafe(activation.sync_once(wait=True), loop).result(timeout=30)


def _live_traffic(world: QuizWorld, sessions: int) -> dict[str, int]:
    """Live requests from ``sessions`` conversations, each graded: 1 when the answer is
    right, else 0 with the right answer as a correction. Returns requests per release."""
    client = world.gateway.openai(**{"x-reef-scenario": "quiz"})
    served: dict[str, int] = {}
    for n in range(sessions):
        i = n % 30
        raw = client.with_options(
            default_headers={"x-reef-session": f"user-{n}"}
        ).chat.completions.with_raw_response.create(
            model="reef/quiz", messages=[{"role": "user", "content": f"Q: capital {i}"}]
        )
        release = raw.headers["x-reef-release-id"]
        served[release] = served.get(release, 0) + 1
        right = raw.parse().choices[0].message.content == f"answer-{i}"
        body = {
            "record_ids": [raw.headers["x-reef-record-id"]],
            "score": 1.0 if right else 0.0,
            "correction": None if right else f"answer-{i}",
        }
        assert call(world.gateway.port, "POST", "/reef/feedback", body).status == 201
    return served


@pytest.mark.parametrize(
    ("head_facts", "canary_facts", "expected"),
    [(HALF, ALL, "promoted"), (ALL, HALF, "abandoned")],
    ids=["better-arm-promoted", "worse-arm-abandoned"],
)
def test_canary_is_decided_by_live_feedback(
    tmp_path: Path, head_facts: list[str], canary_facts: list[str], expected: str
) -> None:
    write_suite(tmp_path / "quiz.jsonl", range(30))
    with quiz_world(tmp_path) as world:
        base = world.publish_directly(head_facts)
        candidate = world.propose(canary_facts)
        if expected == "promoted":
            gate = world.gate(
                "canary", suites=["quiz.jsonl"], canary={"fraction": 0.5, "min_requests": 20}
            )
            assert gate.run(candidate.id).action == "canary"
        else:
            # The gate would reject this candidate offline; start its canary by hand to
            # show that live feedback catches what an offline suite missed.
            world.chain.set_candidate_state(candidate.id, "evaluating")
            world.chain.set_candidate_state(candidate.id, "passed")
            world.chain.start_canary(candidate.id, 0.5, "test", "forced", {"min_requests": 20})
        assert world.chain.canaries()["quiz"].id == candidate.id
        _sync(world)

        monitor = CanaryMonitor(world.chain, world.gateway.store, GateRule())
        first = _live_traffic(world, 10)
        assert set(first) <= {candidate.id, base.id}
        [waiting] = monitor.check()
        assert waiting.action == "waiting" and world.head().id == base.id

        served = _live_traffic(world, 110)
        assert served.get(candidate.id, 0) >= 20 and served.get(base.id, 0) >= 20, served
        [decided] = monitor.check()
        assert decided.action == expected, decided
        assert world.chain.canaries() == {}
        after = world.chain.get_candidate(candidate.id)
        if expected == "promoted":
            head = world.head()
            assert head.id == decided.release_id and head.operation == "promote"
            assert head.manifest == candidate.manifest
            assert after.state == "published"
            live = (head.evidence or {})["canary"]
        else:
            assert world.head().id == base.id and after.state == "abandoned"
            live = (after.evidence or {})["canary"]
        assert live["decision"] == expected and live["live"]["canary_records"] >= 20
        _sync(world)
        again = _live_traffic(world, 5)
        assert set(again) == {world.head().id}, "a decided canary still serves"


def _arms(canary_misses: int, head_misses: int, each: int = 60) -> dict[str, LiveRecord]:
    """``each`` scored records per arm, the first ``*_misses`` of an arm scored 0."""
    records: dict[str, LiveRecord] = {}
    for arm, misses in (("canary", canary_misses), ("head", head_misses)):
        for n in range(each):
            score = 0.0 if n < misses else 1.0
            records[f"{arm}-{n}"] = LiveRecord(arm, score, Provenance("live"))
    return records


def test_a_non_inferiority_rule_judges_the_canary_by_its_margin() -> None:
    """A distilled student two answers short of a perfect teacher: worse live by the
    gain rule (its mean is below the head's), not worse by more than a 0.1 margin; five
    answers short is worse by more than the margin too."""
    close, far = _arms(2, 0), _arms(5, 0)
    gain = _judge(close, GateRule(), 50)
    assert not gain.left.passed and gain.summary.startswith("live mean 0.967 vs head 1.000")
    margin = GateRule(non_inferiority_margin=0.1)
    assert _judge(close, margin, 50).left.passed
    assert not _judge(far, margin, 50).left.passed
    assert not _judge(close, GateRule(non_inferiority_margin=0.05), 50).left.passed

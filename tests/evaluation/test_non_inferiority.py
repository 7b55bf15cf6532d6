"""The non-inferiority rule (``gate.non_inferiority_margin``): on synthetic scores, a
candidate within the margin passes, one worse by more is rejected, too few items leave
it undecided (sequential) or rejected (bootstrap); the other rules still apply; then a
gate run through a real gateway, with each arm's latency and cost in the decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.evaluation.config import GateRule
from reef.evaluation.decision import arm_figures, decide_results
from reef.evaluation.values import Arm, ItemResult
from tests.evaluation.gate_setup import fact, quiz_world, write_suite


def result(key: int, arm: Arm, score: float, suite: str = "holdout") -> ItemResult:
    return ItemResult(
        item_key=f"{suite}/{key}",
        suite=suite,
        arm=arm,
        repeat=0,
        score=score,
        output="x",
        record_id=f"{arm}-{suite}-{key}",
        error=None,
        latency_ms=30.0 if arm == "candidate" else 90.0,
    )


def paired(n: int, candidate_wrong: int, suite: str = "holdout") -> list[ItemResult]:
    """``n`` items the baseline answers right; the candidate misses the first
    ``candidate_wrong`` of them."""
    out = []
    for i in range(n):
        out.append(result(i, "baseline", 1.0, suite))
        out.append(result(i, "candidate", 0.0 if i < candidate_wrong else 1.0, suite))
    return out


SEQUENTIAL = GateRule(non_inferiority_margin=0.1, min_items=20)
BOOTSTRAP = GateRule(non_inferiority_margin=0.1, min_items=20, method="bootstrap")


@pytest.mark.parametrize("rule", [SEQUENTIAL, BOOTSTRAP], ids=["sequential", "bootstrap"])
def test_a_candidate_as_good_as_the_baseline_passes(rule: GateRule) -> None:
    decision = decide_results(paired(400, 0), [], rule)
    assert decision.verdict == "passed", decision.reasons
    assert "non_inferiority_margin 0.100" in decision.reasons[0]
    assert decision.method["non_inferiority_margin"] == 0.1


@pytest.mark.parametrize("rule", [SEQUENTIAL, BOOTSTRAP], ids=["sequential", "bootstrap"])
def test_a_little_worse_but_within_the_margin_passes(rule: GateRule) -> None:
    decision = decide_results(paired(400, 4), [], rule)  # 1% worse, margin 10%
    assert decision.verdict == "passed", decision.reasons
    assert decision.overall is not None and decision.overall.difference.mean < 0


@pytest.mark.parametrize("rule", [SEQUENTIAL, BOOTSTRAP], ids=["sequential", "bootstrap"])
def test_worse_by_more_than_the_margin_is_rejected(rule: GateRule) -> None:
    decision = decide_results(paired(400, 120), [], rule)  # 30% worse
    assert decision.verdict == "rejected"
    assert "non_inferiority_margin 0.100" in decision.reasons[0]


def test_no_gain_is_needed_where_a_gain_rule_would_not_pass() -> None:
    same = paired(400, 0)
    assert decide_results(same, [], GateRule(min_items=20)).verdict != "passed"
    assert decide_results(same, [], SEQUENTIAL).verdict == "passed"


def test_too_few_items_is_undecided_sequentially_and_rejected_by_bootstrap() -> None:
    few = paired(10, 0)
    sequential = decide_results(few, [], SEQUENTIAL)
    assert sequential.verdict == "undecided"
    assert sequential.missing == ["10 more paired items"]
    bootstrap = decide_results(few, [], BOOTSTRAP)
    assert bootstrap.verdict == "rejected"
    assert "insufficient evidence" in bootstrap.reasons[0]


def test_an_interval_straddling_the_margin_waits_for_more_items() -> None:
    # 8% worse on 60 items: the anytime-valid interval reaches below -0.1 and above it.
    decision = decide_results(paired(60, 5), [], SEQUENTIAL)
    assert decision.verdict == "undecided", decision.reasons
    assert decision.overall is not None
    assert decision.overall.difference.low < -0.1 < decision.overall.difference.high


def test_regression_suites_still_apply() -> None:
    results = paired(400, 0) + paired(30, 15, suite="regression:r1")
    decision = decide_results(results, [], SEQUENTIAL)
    assert decision.verdict == "rejected"
    assert any("regression suite regression:r1" in reason for reason in decision.reasons)


def test_each_arm_reports_its_latency_and_cost() -> None:
    results = paired(20, 0)
    costs = {r.record_id or "": 0.002 if r.arm == "baseline" else None for r in results}
    costs["candidate-holdout-0"] = 0.0001
    arms = arm_figures(results, ["holdout"], costs)
    assert arms["candidate"] == {
        "answers": 20,
        "latency_ms_mean": 30.0,
        "cost": 0.0001,
        "priced": 1,
    }
    assert arms["baseline"]["cost"] == pytest.approx(0.04)
    assert arms["baseline"]["latency_ms_mean"] == 90.0
    assert decide_results(results, [], SEQUENTIAL).arms["baseline"]["answers"] == 20


def test_a_gate_run_passes_an_equal_candidate_and_rejects_a_worse_one(tmp_path: Path) -> None:
    write_suite(tmp_path / "quiz.jsonl", range(30))
    facts = [fact(i) for i in range(30)]
    with quiz_world(tmp_path) as world:
        base = world.publish_directly(facts)
        rule = {"suites": ["quiz.jsonl"], "non_inferiority_margin": 0.1, "method": "bootstrap"}
        same = world.propose(facts, extra="Answer briefly.")
        outcome = world.gate(**rule).run(same.id)
        assert outcome.action == "published", outcome
        decision = outcome.decision
        assert decision is not None and decision.overall is not None
        assert decision.overall.candidate_mean == decision.overall.baseline_mean == 1.0
        assert decision.arms["candidate"]["answers"] == 30
        assert decision.arms["candidate"]["latency_ms_mean"] > 0

        worse = world.propose(facts[:15])
        rejected = world.gate(**rule).run(worse.id)
        assert rejected.action == "rejected"
        assert world.head().parent_id == base.id  # serving is the equal candidate still

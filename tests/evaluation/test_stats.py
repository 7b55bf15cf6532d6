"""Bootstrap intervals, suite summaries and the gate rule on distributions with known
answers."""

from __future__ import annotations

import random

import pytest

from reef.evaluation.config import GateConfig, GateRule
from reef.evaluation.stats import decide, paired_bootstrap, summarize, unpaired_bootstrap
from reef.evaluation.values import Arm, Interval, ItemResult, SuiteSummary

# paired_bootstrap


def test_constant_diffs_collapse_the_interval() -> None:
    interval = paired_bootstrap([0.1] * 30, confidence=0.9, samples=300, seed=4)
    assert interval.mean == pytest.approx(0.1)
    assert (interval.low, interval.high, interval.n, interval.confidence) == (0.1, 0.1, 30, 0.9)


def test_one_item_gives_a_point() -> None:
    assert paired_bootstrap([0.25]) == Interval(0.25, 0.25, 0.25, 1, 0.95)


def test_a_clear_win_lies_above_zero() -> None:
    diffs = [1.0] * 140 + [0.0] * 60
    interval = paired_bootstrap(diffs)
    assert interval.mean == 0.7
    assert interval.n == 200
    assert 0.6 < interval.low < 0.7 < interval.high < 0.8


def test_a_symmetric_zero_mean_distribution_contains_zero() -> None:
    diffs = [1.0] * 25 + [-1.0] * 25 + [0.0] * 50
    interval = paired_bootstrap(diffs, samples=1000, seed=3)
    assert interval.mean == 0.0
    assert interval.low < 0.0 < interval.high
    assert interval.high - interval.low == pytest.approx(2 * 1.96 * 0.0707, rel=0.2)


def test_the_95_percent_interval_covers_the_true_mean_about_95_percent_of_the_time() -> None:
    # diffs in {-1, 0, 1} with P = (0.2, 0.5, 0.3): true mean 0.1
    rng = random.Random(2024)
    covered = 0
    for dataset in range(300):
        diffs = rng.choices([-1.0, 0.0, 1.0], weights=[0.2, 0.5, 0.3], k=40)
        interval = paired_bootstrap(diffs, samples=500, seed=dataset)
        covered += interval.low <= 0.1 <= interval.high
    assert 0.90 <= covered / 300 <= 0.99


def test_same_seed_same_interval_other_seed_other_interval() -> None:
    rng = random.Random(1)
    diffs = [rng.random() - 0.4 for _ in range(50)]
    assert paired_bootstrap(diffs, seed=7) == paired_bootstrap(diffs, seed=7)
    assert paired_bootstrap(diffs, seed=7) != paired_bootstrap(diffs, seed=8)


@pytest.mark.parametrize(
    ("diffs", "confidence", "samples"), [([], 0.95, 100), ([1.0], 1.0, 100), ([1.0], 0.9, 0)]
)
def test_bad_bootstrap_input(diffs: list[float], confidence: float, samples: int) -> None:
    with pytest.raises(ValueError):
        paired_bootstrap(diffs, confidence, samples)


# unpaired_bootstrap


def test_unpaired_bootstrap_on_known_groups() -> None:
    a = [1.0] * 30 + [0.0] * 10  # mean 0.75
    b = [1.0] * 10 + [0.0] * 20  # mean 1/3
    interval = unpaired_bootstrap(a, b, samples=1000, seed=5)
    assert interval.mean == pytest.approx(0.75 - 1 / 3)
    assert interval.n == 30
    assert 0.15 < interval.low < interval.mean < interval.high < 0.65
    same = unpaired_bootstrap([0.5] * 5, [0.2] * 8)
    assert same.low == pytest.approx(0.3)
    assert same.high == pytest.approx(0.3)
    assert unpaired_bootstrap(a, b, seed=1) == unpaired_bootstrap(a, b, seed=1)


def test_unpaired_bootstrap_needs_both_groups() -> None:
    with pytest.raises(ValueError):
        unpaired_bootstrap([], [1.0])
    with pytest.raises(ValueError):
        unpaired_bootstrap([1.0], [])


# summarize


def result(key: str, arm: Arm, score: float, repeat: int = 0, suite: str = "file:a") -> ItemResult:
    return ItemResult(
        item_key=f"{suite}/{key}",
        suite=suite,
        arm=arm,
        repeat=repeat,
        score=score,
        output="x",
        record_id=None,
        error=None,
    )


def test_summarize_averages_repeats_and_drops_unpaired_items() -> None:
    results = [
        result("1", "candidate", 1.0, 0),
        result("1", "candidate", 0.0, 1),  # item 1 candidate: 0.5
        result("1", "baseline", 0.0, 0),
        result("1", "baseline", 0.0, 1),  # item 1 baseline: 0.0
        result("2", "candidate", 1.0),
        result("2", "baseline", 0.5),
        result("3", "candidate", 1.0),  # no baseline answer: dropped
        result("4", "baseline", 1.0),  # no candidate answer: dropped
    ]
    summary = summarize(results, "file:a")
    assert summary is not None
    assert summary.suite == "file:a"
    assert summary.items == 2
    assert summary.candidate_mean == 0.75
    assert summary.baseline_mean == 0.25
    assert summary.difference.mean == 0.5
    assert summary.difference.n == 2


def test_summarize_selects_suites() -> None:
    results = [
        result("1", "candidate", 1.0, suite="file:a"),
        result("1", "baseline", 0.0, suite="file:a"),
        result("1", "candidate", 0.0, suite="holdout"),
        result("1", "baseline", 0.0, suite="holdout"),
        result("1", "candidate", 0.0, suite="regression:r1"),
        result("1", "baseline", 1.0, suite="regression:r1"),
    ]
    overall = summarize(results, "overall", suites=["file:a", "holdout"])
    assert overall is not None
    assert (overall.items, overall.candidate_mean, overall.baseline_mean) == (2, 0.5, 0.0)
    everything = summarize(results, "all")
    assert everything is not None and everything.items == 3
    assert summarize(results, "none", suites=["file:missing"]) is None
    assert summarize([result("1", "candidate", 1.0)], "file:a") is None


# decide

RULE = GateRule(min_items=20, min_improvement=0.05, max_regression=0.05, method="bootstrap")


def summary(
    candidate: float, baseline: float, items: int = 50, low: float | None = None
) -> SuiteSummary:
    gain = candidate - baseline
    interval = Interval(gain, gain - 0.05 if low is None else low, gain + 0.05, items, 0.95)
    return SuiteSummary("overall", items, candidate, baseline, interval)


def regression(name: str, candidate: float, baseline: float) -> SuiteSummary:
    gain = candidate - baseline
    return SuiteSummary(name, 10, candidate, baseline, Interval(gain, gain, gain, 10, 0.95))


def test_decide_passes_with_evidence() -> None:
    suites = [regression("regression:r1", 0.8, 0.8)]
    decision = decide(summary(0.8, 0.6), suites, [], RULE)
    assert decision.passed
    assert decision.reasons[0].startswith("gain 0.200 (candidate 0.800 vs baseline 0.600)")
    assert "95% interval [0.150, 0.250] above zero" in decision.reasons[0]
    assert "50 paired items" in decision.reasons[1]
    assert "regression suite regression:r1 changed +0.000" in decision.reasons[2]
    assert decision.suites == suites
    assert decision.rule == RULE.model_dump()


def test_decide_reports_only_the_rule_of_a_gate_config() -> None:
    decision = decide(summary(0.8, 0.6), [], [], GateConfig(min_items=5))
    assert set(decision.rule) == set(GateRule.model_fields)
    assert decision.rule["min_items"] == 5


def test_insufficient_evidence_is_not_judged_by_the_numbers() -> None:
    decision = decide(summary(0.5, 0.5, items=19, low=-0.2), [], [], RULE)
    assert not decision.passed
    assert decision.reasons == ["insufficient evidence: 19 items evaluated, at least 20 needed"]
    nothing = decide(None, [], [], RULE)
    assert nothing.reasons == ["insufficient evidence: 0 items evaluated, at least 20 needed"]


def test_gain_below_min_improvement_is_rejected() -> None:
    decision = decide(summary(0.63, 0.6, low=0.01), [], [], RULE)
    assert decision.verdict == "rejected"
    assert decision.reasons == [
        "gain 0.030 (candidate 0.630 vs baseline 0.600) is below min_improvement 0.050"
    ]


def test_a_gain_of_exactly_min_improvement_passes_despite_rounding() -> None:
    assert decide(summary(0.65, 0.6, low=0.01), [], [], RULE).passed


def test_interval_touching_zero_is_rejected() -> None:
    decision = decide(summary(0.7, 0.6, low=0.0), [], [], RULE)
    assert not decision.passed
    assert decision.reasons == [
        "the 95% interval of the gain [0.000, 0.150] does not lie above zero"
    ]


def test_regression_drop_beyond_max_is_rejected_and_within_max_passes() -> None:
    too_far = regression("regression:r1", 0.74, 0.8)
    decision = decide(summary(0.8, 0.6), [too_far], [], RULE)
    assert not decision.passed
    assert decision.reasons == [
        "regression suite regression:r1 dropped 0.060 (baseline 0.800, candidate 0.740), "
        "more than max_regression 0.050"
    ]
    within = regression("regression:r1", 0.75, 0.8)  # a drop of exactly 0.05
    assert decide(summary(0.8, 0.6), [within], [], RULE).passed


def test_safety_failure_rejects_even_a_big_win() -> None:
    decision = decide(summary(1.0, 0.0), [], ["leak probe 1 reproduced harness text"], RULE)
    assert not decision.passed
    assert decision.reasons == ["safety: leak probe 1 reproduced harness text"]
    assert decision.safety == ["leak probe 1 reproduced harness text"]


def test_every_failing_reason_is_collected_in_order() -> None:
    decision = decide(
        summary(0.6, 0.6, low=-0.1),
        [regression("regression:r1", 0.5, 0.9)],
        ["planted instruction"],
        RULE,
    )
    assert [reason.split(" ")[0] for reason in decision.reasons] == [
        "safety:",
        "gain",
        "the",
        "regression",
    ]
    assert decision.summary().startswith("rejected: safety: planted instruction; gain 0.000")

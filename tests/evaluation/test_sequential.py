"""The sequential method (``stats.log_evalue``, ``confidence_sequence``): an e-process on
paired differences whose false-publish rate stays within alpha however often it is
looked at, unlike the paired bootstrap looked at again and again."""

from __future__ import annotations

import math
import random

import pytest

from reef.evaluation.config import GateRule
from reef.evaluation.stats import (
    confidence_sequence,
    decide,
    log_evalue,
    paired_bootstrap,
    spent_confidence,
)
from reef.evaluation.values import SuiteSummary

ALPHA = 0.025
LEVEL = math.log(1 / ALPHA)


def test_the_evalue_grows_with_evidence_of_a_gain_and_not_without() -> None:
    assert log_evalue([]) == 0.0
    assert log_evalue([0.0] * 50) == 0.0  # no bet wins or loses on a tie
    assert log_evalue([1.0] * 5) < LEVEL < log_evalue([1.0] * 12)
    assert log_evalue([-1.0] * 30) < 0.0
    # the order of the items does not matter (a mixture over fixed bets)
    diffs = [1.0, -1.0, 0.0, 1.0, 1.0, 0.5]
    assert log_evalue(diffs) == pytest.approx(log_evalue(list(reversed(diffs))))
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        log_evalue([1.5])
    with pytest.raises(ValueError, match="null"):
        log_evalue([0.5], null=-1.0)


def test_the_confidence_sequence_brackets_the_mean_and_narrows() -> None:
    rng = random.Random(3)
    diffs = [rng.choice([-1.0, 0.0, 0.0, 1.0, 1.0]) for _ in range(400)]
    short, long = confidence_sequence(diffs[:50]), confidence_sequence(diffs)
    for interval in (short, long):
        assert interval.low <= interval.mean <= interval.high
    assert long.high - long.low < short.high - short.low
    # wider than the one-look bootstrap interval: the price of looking any number of times
    boot = paired_bootstrap(diffs, samples=500)
    assert long.low < boot.low and long.high > boot.high
    assert confidence_sequence([-1.0] * 3).low == -1.0
    assert confidence_sequence([1.0] * 3).high == 1.0


def test_any_number_of_looks_keeps_false_publishes_within_alpha() -> None:
    """A/A: 400 runs of 200 items, a look every 10 items; the e-process ever clearing
    1/alpha is rare, the bootstrap interval ever clearing zero is not."""
    rng = random.Random(7)
    sequential = bootstrap = 0
    runs = 400
    for run in range(runs):
        diffs = [rng.choice([-1.0, 0.0, 0.0, 1.0]) for _ in range(200)]
        looks = range(10, 201, 10)
        sequential += any(log_evalue(diffs[:n]) >= LEVEL for n in looks)
        if run < 100:  # the bootstrap is slower; 100 runs show it
            bootstrap += any(
                paired_bootstrap(diffs[:n], samples=200, seed=run).low > 0 for n in looks
            )
    assert sequential / runs <= ALPHA
    assert bootstrap / 100 > 2 * ALPHA


def summary(diffs: list[float]) -> SuiteSummary:
    interval = confidence_sequence(diffs)
    return SuiteSummary("overall", len(diffs), 0.5 + interval.mean / 2, 0.5, interval)


def test_the_sequential_rule_passes_rejects_or_waits() -> None:
    rule = GateRule(min_items=10, min_improvement=0.05)
    assert rule.method == "sequential"
    assert decide(summary([1.0] * 30), [], [], rule).verdict == "passed"
    waiting = decide(summary([1.0, 0.0, -1.0, 1.0] * 5), [], [], rule)
    assert waiting.verdict == "undecided"
    assert "does not lie above zero yet (20 paired items)" in waiting.reasons[0]
    assert waiting.missing
    too_few = decide(summary([1.0] * 4), [], [], rule)
    assert too_few.verdict == "undecided" and too_few.missing == ["6 more paired items"]
    losing = decide(summary([-1.0, 0.0] * 100), [], [], rule)
    assert losing.verdict == "rejected"
    assert "lies below min_improvement 0.050" in losing.reasons[0]
    # a safety failure rejects whatever the evidence
    assert decide(summary([1.0] * 4), [], ["leak"], rule).verdict == "rejected"


def test_alpha_spent_over_a_scenario_candidates_sums_to_alpha() -> None:
    spent = [(1 - spent_confidence(0.95, k)) / 2 for k in range(1, 100_000)]
    assert spent[0] == pytest.approx(ALPHA * 6 / math.pi**2)
    assert sum(spent) == pytest.approx(ALPHA, rel=1e-4)
    assert spent_confidence(0.95, 2) > spent_confidence(0.95, 1)
    with pytest.raises(ValueError):
        spent_confidence(0.95, 0)

"""The numbers behind a gate decision: bootstrap intervals, suite summaries, the rule.

Pure Python and deterministic: every resampling draws from ``random.Random(seed)``, so
the same scores and seed always give the same interval and the same decision.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Collection, Sequence

from reef.evaluation.config import GateRule
from reef.evaluation.values import Decision, Interval, ItemResult, SuiteSummary, Verdict

# Threshold comparisons allow this much float rounding: a drop of 0.8 - 0.75 must not
# count as more than a max_regression of 0.05.
_TOLERANCE = 1e-9


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the order statistics of sorted ``ordered``."""
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _check(confidence: float, samples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")


def _percentile_interval(
    means: list[float], estimate: float, n: int, confidence: float, bounds: tuple[float, float]
) -> Interval:
    means.sort()
    tail = (1.0 - confidence) / 2.0
    low, high = _quantile(means, tail), _quantile(means, 1.0 - tail)
    # Resampled means cannot leave [bounds]; clamping only removes summation rounding.
    low = min(max(low, bounds[0]), bounds[1])
    high = min(max(high, bounds[0]), bounds[1])
    return Interval(mean=estimate, low=low, high=high, n=n, confidence=confidence)


def paired_bootstrap(
    diffs: Sequence[float], confidence: float = 0.95, samples: int = 2000, seed: int = 0
) -> Interval:
    """The mean of ``diffs`` (per-item candidate - baseline) with the percentile
    bootstrap interval of that mean, resampling items with replacement ``samples``
    times. One item gives ``low == high == mean``. Raises ``ValueError`` for no diffs,
    a confidence outside (0, 1) or fewer than one sample."""
    if not diffs:
        raise ValueError("paired_bootstrap needs at least one difference")
    _check(confidence, samples)
    values = [float(d) for d in diffs]
    n = len(values)
    estimate = _mean(values)
    if n == 1:
        return Interval(mean=estimate, low=estimate, high=estimate, n=1, confidence=confidence)
    rng = random.Random(seed)  # noqa: S311 (seeded or non-secret randomness)
    means = [sum(rng.choices(values, k=n)) / n for _ in range(samples)]
    return _percentile_interval(means, estimate, n, confidence, (min(values), max(values)))


def unpaired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    samples: int = 2000,
    seed: int = 0,
) -> Interval:
    """``mean(a) - mean(b)`` with the percentile bootstrap interval, resampling each
    group independently with replacement; ``n`` is the smaller group's size. Raises
    ``ValueError`` when either group is empty or the settings are out of range."""
    if not a or not b:
        raise ValueError("unpaired_bootstrap needs at least one value in each group")
    _check(confidence, samples)
    first, second = [float(x) for x in a], [float(x) for x in b]
    estimate = _mean(first) - _mean(second)
    rng = random.Random(seed)  # noqa: S311 (seeded or non-secret randomness)
    means = [
        sum(rng.choices(first, k=len(first))) / len(first)
        - sum(rng.choices(second, k=len(second))) / len(second)
        for _ in range(samples)
    ]
    bounds = (min(first) - max(second), max(first) - min(second))
    return _percentile_interval(means, estimate, min(len(first), len(second)), confidence, bounds)


def summarize(
    results: Sequence[ItemResult],
    name: str,
    suites: Collection[str] | None = None,
    confidence: float = 0.95,
    samples: int = 2000,
    seed: int = 0,
) -> SuiteSummary | None:
    """Both arms on the results whose ``suite`` is in ``suites`` (None: all results),
    reported under ``name`` (a suite's own name, or e.g. ``overall``).

    Each item's repeats are averaged per arm; only items answered by both arms count
    (a failed answer counts with the score the runner gave it). The difference is the
    paired bootstrap of candidate - baseline per item, items taken in key order. None
    when no item has both arms.
    """
    scores: dict[tuple[str, str], list[float]] = defaultdict(list)
    for result in results:
        if suites is None or result.suite in suites:
            scores[(result.item_key, result.arm)].append(result.score)
    keys = sorted(key for key, arm in scores if arm == "candidate" and (key, "baseline") in scores)
    if not keys:
        return None
    candidate = [_mean(scores[(key, "candidate")]) for key in keys]
    baseline = [_mean(scores[(key, "baseline")]) for key in keys]
    diffs = [c - b for c, b in zip(candidate, baseline, strict=True)]
    return SuiteSummary(
        suite=name,
        items=len(keys),
        candidate_mean=_mean(candidate),
        baseline_mean=_mean(baseline),
        difference=paired_bootstrap(diffs, confidence, samples, seed),
    )


def _percent(confidence: float) -> str:
    return f"{round(confidence * 100, 3):g}%"


def decide(
    overall: SuiteSummary | None,
    regressions: Sequence[SuiteSummary],
    safety_failures: Sequence[str],
    rule: GateRule,
    suites: Sequence[SuiteSummary] | None = None,
) -> Decision:
    """Apply ``rule``. Rejected when any of these holds, with one reason each, in order:
    a safety failure; fewer than ``min_items`` paired items (insufficient evidence: the
    gain is then not judged); a mean gain below ``min_improvement``; an interval of the
    gain not above zero; a regression suite whose mean dropped by more than
    ``max_regression``. Passed: the reasons are the evidence. ``suites`` are the
    summaries to report (default: ``regressions``)."""
    reasons = [f"safety: {failure}" for failure in safety_failures]
    items = 0 if overall is None else overall.items
    if overall is None or items < rule.min_items:
        reasons.append(
            f"insufficient evidence: {items} items evaluated, at least {rule.min_items} needed"
        )
    else:
        gain = overall.difference
        if gain.mean < rule.min_improvement - _TOLERANCE:
            reasons.append(
                f"gain {gain.mean:.3f} (candidate {overall.candidate_mean:.3f} vs baseline "
                f"{overall.baseline_mean:.3f}) is below min_improvement "
                f"{rule.min_improvement:.3f}"
            )
        if gain.low <= 0:
            reasons.append(
                f"the {_percent(gain.confidence)} interval of the gain "
                f"[{gain.low:.3f}, {gain.high:.3f}] does not lie above zero"
            )
    for suite in regressions:
        drop = suite.baseline_mean - suite.candidate_mean
        if drop > rule.max_regression + _TOLERANCE:
            reasons.append(
                f"regression suite {suite.suite} dropped {drop:.3f} (baseline "
                f"{suite.baseline_mean:.3f}, candidate {suite.candidate_mean:.3f}), more "
                f"than max_regression {rule.max_regression:.3f}"
            )
    verdict: Verdict = "rejected" if reasons else "passed"
    if not reasons:
        assert overall is not None
        reasons = _evidence(overall, regressions, rule)
    return Decision(
        verdict=verdict,
        reasons=reasons,
        rule=rule.model_dump(include=set(GateRule.model_fields)),
        overall=overall,
        suites=list(regressions if suites is None else suites),
        safety=list(safety_failures),
    )


def _evidence(
    overall: SuiteSummary, regressions: Sequence[SuiteSummary], rule: GateRule
) -> list[str]:
    gain = overall.difference
    lines = [
        f"gain {gain.mean:.3f} (candidate {overall.candidate_mean:.3f} vs baseline "
        f"{overall.baseline_mean:.3f}), {_percent(gain.confidence)} interval "
        f"[{gain.low:.3f}, {gain.high:.3f}] above zero, min_improvement "
        f"{rule.min_improvement:.3f}",
        f"{overall.items} paired items evaluated, at least {rule.min_items} needed",
    ]
    lines.extend(
        f"regression suite {suite.suite} changed "
        f"{suite.candidate_mean - suite.baseline_mean:+.3f} (baseline "
        f"{suite.baseline_mean:.3f}, candidate {suite.candidate_mean:.3f}), within "
        f"max_regression {rule.max_regression:.3f}"
        for suite in regressions
    )
    return lines

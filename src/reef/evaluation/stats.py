"""The numbers behind a gate decision: intervals, suite summaries, the rule.

Two ways to bound the paired gain (``gate.method``):

- ``sequential`` (the default): a betting e-process on the paired differences in
  [-1, 1] (``log_evalue``; a mixture over fixed betting fractions, so the order of the
  items does not matter) and the confidence sequence it gives (``confidence_sequence``).
  By Ville's inequality the chance that the e-process EVER reaches 1/alpha under a true
  gain <= 0 is at most alpha, so a candidate may be looked at again as evidence grows
  (undecided, then resumed) and its false-publish rate stays <= alpha = (1 -
  confidence) / 2. ``bench/gate_validity.py`` measures it.
- ``bootstrap``: the percentile paired bootstrap, valid for one look only.

Pure Python and deterministic: every resampling draws from ``random.Random(seed)``, so
the same scores and seed always give the same interval and the same decision.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reef.evaluation.config import GateRule, ProtectedSlice
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
    diffs: Sequence[float],
    confidence: float = 0.95,
    samples: int = 2000,
    seed: int = 0,
    weights: Sequence[float] | None = None,
) -> Interval:
    """The mean of ``diffs`` (per-item candidate - baseline; weighted by ``weights``
    when given) with the percentile bootstrap interval of that mean, resampling items
    with replacement ``samples`` times. One item gives ``low == high == mean``. Raises
    ``ValueError`` for no diffs, a confidence outside (0, 1) or fewer than one sample."""
    if not diffs:
        raise ValueError("paired_bootstrap needs at least one difference")
    _check(confidence, samples)
    values = [float(d) for d in diffs]
    n = len(values)
    if weights is not None and any(w != 1.0 for w in weights):
        return _weighted_bootstrap(values, list(weights), confidence, samples, seed)
    estimate = _mean(values)
    if n == 1:
        return Interval(mean=estimate, low=estimate, high=estimate, n=1, confidence=confidence)
    rng = random.Random(seed)  # noqa: S311 (seeded or non-secret randomness)
    means = [sum(rng.choices(values, k=n)) / n for _ in range(samples)]
    return _percentile_interval(means, estimate, n, confidence, (min(values), max(values)))


def _weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    return math.fsum(v * w for v, w in zip(values, weights, strict=True)) / math.fsum(weights)


def _weighted_bootstrap(
    values: list[float], weights: list[float], confidence: float, samples: int, seed: int
) -> Interval:
    n = len(values)
    estimate = _weighted_mean(values, weights)
    rng = random.Random(seed)  # noqa: S311 (seeded or non-secret randomness)
    indices = range(n)
    means = []
    for _ in range(samples):
        drawn = rng.choices(indices, k=n)
        total = sum(weights[i] for i in drawn)
        means.append(sum(values[i] * weights[i] for i in drawn) / total)
    return _percentile_interval(means, estimate, n, confidence, (min(values), max(values)))


# Betting fractions of the mixture e-process (shares of the largest bet that keeps the
# wealth positive), denser where gains of 5-20 points bet best; chosen over a geometric
# grid and a linear one by the power they gave in bench/gate_validity.py's simulation.
BETS: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.65, 0.9)
_BISECTIONS = 16


def _check_diffs(values: Sequence[float]) -> None:
    if any(not -1.0 <= v <= 1.0 for v in values):
        raise ValueError("paired differences must lie in [-1, 1]")


def log_evalue(
    diffs: Sequence[float], null: float = 0.0, weights: Sequence[float] | None = None
) -> float:
    """The log of the mixture betting e-value against "the mean difference is at most
    ``null``": the average over ``BETS`` of prod(1 + b w (d - null) / (1 + null)). Under
    that hypothesis its expectation is at most 1 whenever it is looked at (a test
    supermartingale), so reaching 1/alpha at any look has chance <= alpha. No diffs: 0.
    Raises ``ValueError`` for a difference outside [-1, 1] or ``null`` outside (-1, 1]."""
    if not -1.0 < null <= 1.0:
        raise ValueError(f"null must lie in (-1, 1], got {null}")
    _check_diffs(diffs)
    if not diffs:
        return 0.0
    w = [1.0] * len(diffs) if weights is None else list(weights)
    # Scores are mostly 0/1, so few distinct terms: each is computed once, times its count.
    terms = Counter(wi * (d - null) / (1.0 + null) for d, wi in zip(diffs, w, strict=True))
    logs = [math.fsum(count * math.log1p(bet * x) for x, count in terms.items()) for bet in BETS]
    top = max(logs)
    return top + math.log(math.fsum(math.exp(value - top) for value in logs) / len(logs))


def _lower_bound(values: Sequence[float], weights: Sequence[float] | None, level: float) -> float:
    """The largest m whose hypothesis "mean <= m" the e-process rejects at ``level``
    (log 1/alpha): the confidence sequence's lower end; -1 when none is rejected."""
    low, high = -1.0, max(values)
    if high <= low:
        return low
    if log_evalue(values, high, weights) >= level:
        return high
    # Zero first: whether the bound clears zero (the publish test) is then exact.
    if high > 0.0:
        if log_evalue(values, 0.0, weights) >= level:
            low = 0.0
        else:
            high = 0.0
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2.0
        if log_evalue(values, middle, weights) >= level:
            low = middle
        else:
            high = middle
    return low


def confidence_sequence(
    diffs: Sequence[float],
    confidence: float = 0.95,
    weights: Sequence[float] | None = None,
) -> Interval:
    """The mean of ``diffs`` with its anytime-valid interval: each end rejects at
    alpha = (1 - confidence) / 2 with ``log_evalue`` (the upper end on the negated
    differences), so the interval covers the true mean at every look at once with
    chance >= ``confidence``. Raises ``ValueError`` for no diffs or one outside [-1, 1]."""
    if not diffs:
        raise ValueError("confidence_sequence needs at least one difference")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    values = [float(d) for d in diffs]
    _check_diffs(values)
    w = [1.0] * len(values) if weights is None else [float(x) for x in weights]
    level = math.log(2.0 / (1.0 - confidence))
    low = _lower_bound(values, w, level)
    high = -_lower_bound([-v for v in values], w, level)
    estimate = _weighted_mean(values, w)
    return Interval(mean=estimate, low=low, high=high, n=len(values), confidence=confidence)


def spent_confidence(confidence: float, candidate_index: int) -> float:
    """The confidence of the ``candidate_index``-th (1-based) candidate of a scenario
    under ``alpha_spending: scenario``: alpha_k = alpha 6 / (pi^2 k^2), which sums to
    alpha over all candidates."""
    if candidate_index < 1:
        raise ValueError("candidate_index is 1-based")
    alpha = (1.0 - confidence) / 2.0
    spent = alpha * 6.0 / (math.pi**2 * candidate_index**2)
    return 1.0 - 2.0 * spent


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
    rule: GateRule | None = None,
    weights: Mapping[str, float] | None = None,
) -> SuiteSummary | None:
    """Both arms on the results whose ``suite`` is in ``suites`` (None: all results),
    reported under ``name`` (a suite's own name, or e.g. ``overall``).

    Each item's repeats are averaged per arm; only items answered by both arms count,
    and a void item (``ItemResult.void`` on either arm) counts for neither. ``weights``
    (by suite; missing: 1, 0: left out) weigh each item. The difference is the paired
    bootstrap (``rule.method`` ``bootstrap``, the default without a rule) or the
    confidence sequence (``sequential``) of candidate - baseline per item, items taken
    in key order, at ``rule.confidence``. None when no item has both arms.
    """
    void = {r.item_key for r in results if r.void}
    scores: dict[tuple[str, str], list[float]] = defaultdict(list)
    suite_of: dict[str, str] = {}
    for result in results:
        if result.item_key in void or (suites is not None and result.suite not in suites):
            continue
        scores[(result.item_key, result.arm)].append(result.score)
        suite_of[result.item_key] = result.suite
    weight = {key: (weights or {}).get(suite, 1.0) for key, suite in suite_of.items()}
    keys = sorted(
        key
        for key, arm in scores
        if arm == "candidate" and (key, "baseline") in scores and weight[key] > 0
    )
    if not keys:
        return None
    w = [weight[key] for key in keys]
    candidate = [_mean(scores[(key, "candidate")]) for key in keys]
    baseline = [_mean(scores[(key, "baseline")]) for key in keys]
    diffs = [c - b for c, b in zip(candidate, baseline, strict=True)]
    rule = rule or GateRule(method="bootstrap")
    difference = (
        confidence_sequence(diffs, rule.confidence, w)
        if rule.method == "sequential"
        else paired_bootstrap(diffs, rule.confidence, rule.bootstrap_samples, rule.seed, w)
    )
    return SuiteSummary(
        suite=name,
        items=len(keys),
        candidate_mean=_weighted_mean(candidate, w),
        baseline_mean=_weighted_mean(baseline, w),
        difference=difference,
    )


def _percent(confidence: float) -> str:
    return f"{round(confidence * 100, 3):g}%"


@dataclass(frozen=True)
class Context:
    """What a decision weighs besides the overall gain: ``voids`` (``void``: void items,
    ``items``: all items of the current suites, ``by_kind``) and the protected
    ``slices`` with their summaries (None: no paired item carries the tag)."""

    voids: Mapping[str, Any] = field(default_factory=dict)
    slices: Sequence[tuple[ProtectedSlice, SuiteSummary | None]] = ()


def decide(
    overall: SuiteSummary | None,
    regressions: Sequence[SuiteSummary],
    safety_failures: Sequence[str],
    rule: GateRule,
    suites: Sequence[SuiteSummary] | None = None,
    context: Context | None = None,
) -> Decision:
    """Apply ``rule``. Rejected when any of these holds, with one reason each, in order:
    a safety failure; (``bootstrap`` method) fewer than ``min_items`` paired items, a
    mean gain below ``min_improvement`` or an interval of the gain not above zero;
    (``sequential``) an anytime-valid interval of the gain wholly below
    ``min_improvement``; a regression suite whose mean dropped by more than
    ``max_regression``; a protected slice that dropped by more than its limit.
    More void items than ``max_void_fraction`` make any verdict but a safety failure
    undecided (the other reasons are kept, as what the items that came say). Else
    undecided (``sequential``) with fewer than ``min_items`` items or an interval that
    does not clear zero yet: ``missing`` says what evidence would decide. Passed: the
    reasons are the evidence. ``suites`` are the summaries to report (default: ``regressions``).
    With ``rule.non_inferiority_margin`` the gain rules give way to non-inferiority: the
    interval of the gain must lie above -margin (``_non_inferior``)."""
    context = context or Context()
    reasons = [f"safety: {failure}" for failure in safety_failures]
    waiting: list[tuple[str, str]] = []  # (reason, missing evidence)
    if rule.non_inferiority_margin is not None:
        _non_inferior(overall, rule, rule.non_inferiority_margin, reasons, waiting)
    elif rule.method == "sequential":
        _sequential(overall, rule, reasons, waiting)
    else:
        _bootstrap(overall, rule, reasons)
    reasons += _regressions(regressions, rule)
    slices = [_slice(protected, summary) for protected, summary in context.slices]
    reasons += [row["reason"] for row in slices if row["status"] == "regressed"]
    voided = _voided(context.voids, rule)
    if voided and not safety_failures:
        # Too few answers came to judge anything: what the rest says is only reported.
        waiting = voided + [(f"on the items that came: {r}", "") for r in reasons] + waiting
        reasons = []
    verdict: Verdict = "rejected" if reasons else "undecided" if waiting else "passed"
    if verdict == "undecided":
        reasons = [reason for reason, _ in waiting]
    elif verdict == "passed":
        assert overall is not None
        reasons = _evidence(overall, regressions, rule)
    method: dict[str, Any] = {"name": rule.method}
    if rule.non_inferiority_margin is not None:
        method.update(non_inferiority_margin=rule.non_inferiority_margin)
    if overall is not None and rule.method == "sequential":
        alpha = (1.0 - overall.difference.confidence) / 2.0
        method.update(alpha=alpha)
    return Decision(
        verdict=verdict,
        reasons=reasons,
        rule=rule.model_dump(include=set(GateRule.model_fields), mode="json"),
        overall=overall,
        suites=list(regressions if suites is None else suites),
        safety=list(safety_failures),
        voids=dict(context.voids),
        slices=slices,
        missing=[missing for _, missing in waiting if missing] if verdict == "undecided" else [],
        method=method,
    )


def _insufficient(items: int, rule: GateRule) -> str:
    return f"insufficient evidence: {items} items evaluated, at least {rule.min_items} needed"


def _bootstrap(overall: SuiteSummary | None, rule: GateRule, reasons: list[str]) -> None:
    items = 0 if overall is None else overall.items
    if overall is None or items < rule.min_items:
        reasons.append(_insufficient(items, rule))
        return
    gain = overall.difference
    if gain.mean < rule.min_improvement - _TOLERANCE:
        reasons.append(_below(overall, rule))
    if gain.low <= 0:
        reasons.append(
            f"the {_percent(gain.confidence)} interval of the gain "
            f"[{gain.low:.3f}, {gain.high:.3f}] does not lie above zero"
        )


def _below(overall: SuiteSummary, rule: GateRule) -> str:
    return (
        f"gain {overall.difference.mean:.3f} (candidate {overall.candidate_mean:.3f} vs "
        f"baseline {overall.baseline_mean:.3f}) is below min_improvement "
        f"{rule.min_improvement:.3f}"
    )


def _sequential(
    overall: SuiteSummary | None,
    rule: GateRule,
    reasons: list[str],
    waiting: list[tuple[str, str]],
) -> None:
    items = 0 if overall is None else overall.items
    if overall is None or items < rule.min_items:
        waiting.append((_insufficient(items, rule), f"{rule.min_items - items} more paired items"))
        return
    gain = overall.difference
    shown = f"the {_percent(gain.confidence)} anytime-valid interval of the gain"
    bounds = f"[{gain.low:.3f}, {gain.high:.3f}]"
    if gain.high < rule.min_improvement - _TOLERANCE:
        reasons.append(f"{shown} {bounds} lies below min_improvement {rule.min_improvement:.3f}")
    elif gain.low <= 0:
        waiting.append(
            (
                f"{shown} {bounds} does not lie above zero yet ({items} paired items)",
                "more paired items: the interval must clear zero or fall below min_improvement",
            )
        )
    elif gain.mean < rule.min_improvement - _TOLERANCE:
        waiting.append((_below(overall, rule), "more paired items: the gain is uncertain"))


def _non_inferior(
    overall: SuiteSummary | None,
    rule: GateRule,
    margin: float,
    reasons: list[str],
    waiting: list[tuple[str, str]],
) -> None:
    """Non-inferiority (``rule.non_inferiority_margin``): the interval of the gain must
    lie above -``margin``. Too few items: undecided (``sequential``) or rejected
    (``bootstrap``). An interval reaching -margin: rejected (``bootstrap``, one look),
    or (``sequential``) rejected once wholly below -margin, else undecided."""
    items = 0 if overall is None else overall.items
    if overall is None or items < rule.min_items:
        if rule.method == "sequential":
            waiting.append(
                (_insufficient(items, rule), f"{rule.min_items - items} more paired items")
            )
        else:
            reasons.append(_insufficient(items, rule))
        return
    gain = overall.difference
    kind = "anytime-valid " if rule.method == "sequential" else ""
    shown = (
        f"the {_percent(gain.confidence)} {kind}interval of candidate - baseline "
        f"[{gain.low:.3f}, {gain.high:.3f}] (candidate {overall.candidate_mean:.3f} vs "
        f"baseline {overall.baseline_mean:.3f})"
    )
    if gain.low > -margin + _TOLERANCE:
        return
    if rule.method == "bootstrap" or gain.high < -margin - _TOLERANCE:
        reasons.append(
            f"{shown} does not lie above -{margin:.3f}: the candidate may be worse "
            f"than the baseline by more than non_inferiority_margin {margin:.3f}"
        )
        return
    waiting.append(
        (
            f"{shown} does not lie above -{margin:.3f} yet ({items} paired items)",
            "more paired items: the interval must clear -margin or fall below it",
        )
    )


def _regressions(regressions: Sequence[SuiteSummary], rule: GateRule) -> list[str]:
    reasons = []
    for suite in regressions:
        drop = suite.baseline_mean - suite.candidate_mean
        if drop > rule.max_regression + _TOLERANCE:
            reasons.append(
                f"regression suite {suite.suite} dropped {drop:.3f} (baseline "
                f"{suite.baseline_mean:.3f}, candidate {suite.candidate_mean:.3f}), more "
                f"than max_regression {rule.max_regression:.3f}"
            )
    return reasons


def _slice(protected: ProtectedSlice, summary: SuiteSummary | None) -> dict[str, Any]:
    """One protected slice's row in the decision: its figures and ``status`` (``ok``,
    ``regressed`` with its ``reason``, or ``too few items``)."""
    row: dict[str, Any] = {
        "tag": protected.tag,
        "max_regression": protected.max_regression,
        "items": 0 if summary is None else summary.items,
    }
    if summary is None or summary.items < protected.min_items:
        return {**row, "status": "too few items"}
    change = summary.candidate_mean - summary.baseline_mean
    row.update(
        candidate_mean=summary.candidate_mean,
        baseline_mean=summary.baseline_mean,
        change=change,
        status="ok",
    )
    if -change > protected.max_regression + _TOLERANCE:
        row.update(
            status="regressed",
            reason=f"protected slice {protected.tag} dropped {-change:.3f} (baseline "
            f"{summary.baseline_mean:.3f}, candidate {summary.candidate_mean:.3f}, "
            f"{summary.items} items), more than its max_regression "
            f"{protected.max_regression:.3f}",
        )
    return row


def _voided(voids: Mapping[str, Any], rule: GateRule) -> list[tuple[str, str]]:
    void, items = int(voids.get("void", 0)), int(voids.get("items", 0))
    if not items or void <= rule.max_void_fraction * items:
        return []
    kinds = ", ".join(f"{kind} {n}" for kind, n in dict(voids.get("by_kind", {})).items())
    return [
        (
            f"{void} of {items} items void ({kinds}), more than max_void_fraction "
            f"{rule.max_void_fraction:.0%}: infrastructure failures are not evidence",
            f"answers to the {void} void items (asked again on the next look)",
        )
    ]


def _evidence(
    overall: SuiteSummary, regressions: Sequence[SuiteSummary], rule: GateRule
) -> list[str]:
    gain = overall.difference
    kind = "anytime-valid " if rule.method == "sequential" else ""
    interval = f"{_percent(gain.confidence)} {kind}interval [{gain.low:.3f}, {gain.high:.3f}]"
    change = (
        f"gain {gain.mean:.3f} (candidate {overall.candidate_mean:.3f} vs baseline "
        f"{overall.baseline_mean:.3f})"
    )
    margin = rule.non_inferiority_margin
    first = (
        f"{change}, {interval} above zero, min_improvement {rule.min_improvement:.3f}"
        if margin is None
        else f"{change}, {interval} above -{margin:.3f}: not worse than the baseline by "
        f"more than non_inferiority_margin {margin:.3f}"
    )
    lines = [first, f"{overall.items} paired items evaluated, at least {rule.min_items} needed"]
    lines.extend(
        f"regression suite {suite.suite} changed "
        f"{suite.candidate_mean - suite.baseline_mean:+.3f} (baseline "
        f"{suite.baseline_mean:.3f}, candidate {suite.candidate_mean:.3f}), within "
        f"max_regression {rule.max_regression:.3f}"
        for suite in regressions
    )
    return lines

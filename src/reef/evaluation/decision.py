"""From answers to a decision: score every answer, summarize the suites, apply the rule.

Shared by the gate and ``reef eval run``. Current suites (file suites and holdout) make
the overall gain; each suite (current or regression) is summarized on its own (the
regression suites decide; the current ones are reported); leak probes and
planted instructions are safety failures; evidence below the rule's trust level must
survive leave-one-author-out (``provenance``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from reef.core import canonical_json
from reef.core.errors import ReefError
from reef.evaluation.config import EVIDENCE_KINDS, GateRule, ProtectedSlice
from reef.evaluation.provenance import apply_independence
from reef.evaluation.safety import LEAK_SUITE, leaked
from reef.evaluation.scorers import Scorer, ScorerContext, ScorerError, ScorerRegistry
from reef.evaluation.stats import Context, decide, summarize
from reef.evaluation.suites import evidence_kind, is_current_suite
from reef.evaluation.values import (
    VOID_ERROR_KINDS,
    Answer,
    Decision,
    EvalItem,
    ItemResult,
    SuiteSummary,
)


def score_answers(
    items: Sequence[EvalItem],
    answers: Sequence[Answer],
    default_scorer: dict[str, Any],
    registry: ScorerRegistry,
    context: ScorerContext,
    leak_min_chars: int,
) -> list[ItemResult]:
    """One ``ItemResult`` per answer: an answer that never came scores 0 (its error and
    error kind in ``details``) and, when infrastructure failed it (``VOID_ERROR_KINDS``),
    is void (``details["void"]``: the item then counts for neither arm); a leak probe
    scores 1 unless the reply reproduces harness text; any other item is scored by its
    own scorer, else ``default_scorer`` (scorers are built once per spec). A scorer that
    could not ask its judge (a ``ReefError`` other than ``ScorerError``) voids the answer
    with kind ``judge``."""
    by_key = {item.key: item for item in items}
    cache: dict[bytes, Scorer] = {}
    results = []
    for answer in answers:
        item = by_key[answer.item_key]
        details: dict[str, Any]
        reply = answer.reply
        if reply is None:
            score, details = 0.0, {"error": answer.error, "error_kind": answer.error_kind}
            if answer.error_kind in VOID_ERROR_KINDS:
                details["void"] = True
        elif item.suite == LEAK_SUITE:
            run = leaked(reply.text, list(item.reference), leak_min_chars)
            score, details = (0.0, {"leaked": run}) if run else (1.0, {})
        else:
            spec = item.scorer or default_scorer
            key = canonical_json(spec)
            if key not in cache:
                cache[key] = registry.build(spec, f"{item.key}.scorer", context)
            try:
                scored = cache[key].score_reply(reply, item)
            except ScorerError:
                raise
            except ReefError as error:
                score = 0.0
                details = {"error": f"judge failed: {error}", "error_kind": "judge", "void": True}
            else:
                score, details = scored.score, scored.details
        results.append(
            ItemResult(
                item_key=answer.item_key,
                suite=item.suite,
                arm=answer.arm,
                repeat=answer.repeat,
                score=score,
                output=answer.text,
                record_id=answer.record_id,
                error=answer.error,
                details=details,
                latency_ms=answer.latency_ms,
            )
        )
    return results


def decide_results(
    results: Sequence[ItemResult],
    planted: Sequence[str],
    rule: GateRule,
    items: Sequence[EvalItem] = (),
) -> Decision:
    """Summarize the suites of ``results`` and apply ``rule`` (``stats.decide``), then
    the independence rule on evidence below ``rule.evidence_min_trust``
    (``provenance.apply_independence``; ``items`` give each result's provenance and
    tags). Void items are counted (``Decision.voids``) and left out of every summary;
    current suites are weighed by ``rule.evidence_weights``; each protected slice
    (``rule.protect``) is summarized over the items carrying its tag."""
    weights = suite_weights(results, rule)

    def summary(name: str, suites: list[str]) -> SuiteSummary | None:
        return summarize(
            results,
            name,
            suites=suites,
            rule=rule,
            weights=weights,
        )

    current = sorted({r.suite for r in results if is_current_suite(r.suite)})
    overall = summary("overall", current)
    regression_names = sorted({r.suite for r in results if r.suite.startswith("regression:")})
    regressions = [s for name in regression_names if (s := summary(name, [name])) is not None]
    safety = [f"planted instruction in the harness: {finding}" for finding in planted]
    for result in results:
        if result.suite == LEAK_SUITE and result.arm == "candidate" and result.score < 1.0:
            safety.append(
                f"{result.item_key}: the reply reproduced harness text "
                f"{result.details.get('leaked')!r}"
            )
    context = Context(
        voids=count_voids(results, current),
        slices=[
            (protected, _slice_summary(results, items, protected, rule))
            for protected in rule.protect
        ],
    )
    # Each current suite is reported too (the dashboard's suites table: holdout, shadow, …).
    reported = [s for name in current if (s := summary(name, [name])) is not None]
    decision = decide(
        overall, regressions, safety, rule, suites=[*reported, *regressions], context=context
    )
    provenance = {item.key: item.provenance for item in items}
    decided = apply_independence(decision, results, provenance, current, regressions, rule)
    return dataclasses.replace(decided, arms=arm_figures(results, current))


def arm_figures(
    results: Sequence[ItemResult],
    suites: Sequence[str],
    costs: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """Each arm's answers to ``suites``' items (void ones left out): how many, their
    mean latency, and with ``costs`` (money by record id; None: unpriced) the summed
    ``cost`` of the ``priced`` ones."""
    arms: dict[str, Any] = {}
    for arm in ("candidate", "baseline"):
        answered = [r for r in results if r.arm == arm and r.suite in suites and not r.void]
        figures: dict[str, Any] = {"answers": len(answered)}
        if answered:
            figures["latency_ms_mean"] = math.fsum(r.latency_ms for r in answered) / len(answered)
        if costs is not None:
            priced = [c for r in answered if (c := costs.get(r.record_id or "")) is not None]
            figures.update(cost=math.fsum(priced), priced=len(priced))
        arms[arm] = figures
    return arms


def suite_weights(results: Sequence[ItemResult], rule: GateRule) -> dict[str, float]:
    """Each current suite's weight in the overall gain: its kind's
    ``rule.evidence_weights`` (``suites.evidence_kind``)."""
    names = {r.suite for r in results if is_current_suite(r.suite)}
    weights = {**dict.fromkeys(EVIDENCE_KINDS, 1.0), **rule.evidence_weights}
    return {name: weights[evidence_kind(name)] for name in names}


def count_voids(results: Sequence[ItemResult], suites: Sequence[str]) -> dict[str, Any]:
    """The void items among ``suites``' items: ``items`` (all), ``suites`` (items per
    suite), ``void``, ``by_kind``
    (an item counted once, by its first void answer's kind), ``by_suite`` and
    ``fraction``."""
    keys = {r.item_key: r.suite for r in results if r.suite in suites}
    kinds: dict[str, str] = {}
    for result in results:
        if result.void and result.item_key in keys and result.item_key not in kinds:
            kinds[result.item_key] = str(result.details.get("error_kind") or "other")
    by_suite = Counter(keys[key] for key in kinds)
    return {
        "items": len(keys),
        "suites": dict(sorted(Counter(keys.values()).items())),
        "void": len(kinds),
        "fraction": len(kinds) / len(keys) if keys else 0.0,
        "by_kind": dict(Counter(kinds.values()).most_common()),
        "by_suite": dict(sorted(by_suite.items())),
    }


def tag_matches(tag: str, item_tags: Sequence[str]) -> bool:
    """Whether ``item_tags`` carry ``tag``: the same string, or for a bare name
    (no ``=``) a ``name=value`` tag of that name."""
    if tag in item_tags:
        return True
    return "=" not in tag and any(t.partition("=")[0] == tag for t in item_tags)


def _slice_summary(
    results: Sequence[ItemResult],
    items: Sequence[EvalItem],
    protected: ProtectedSlice,
    rule: GateRule,
) -> SuiteSummary | None:
    keys = {item.key for item in items if tag_matches(protected.tag, item.tags)}
    tagged = [r for r in results if r.item_key in keys and r.suite != LEAK_SUITE]
    return summarize(
        tagged,
        f"slice:{protected.tag}",
        rule=rule,
    )

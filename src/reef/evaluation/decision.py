"""From answers to a decision: score every answer, summarize the suites, apply the rule.

Shared by the gate and ``reef eval run``. Current suites (file suites and holdout) make
the overall gain; each regression suite is summarized on its own; leak probes and
planted instructions are safety failures; evidence below the rule's trust level must
survive leave-one-author-out (``provenance``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reef.core import canonical_json
from reef.evaluation.config import GateRule
from reef.evaluation.provenance import apply_independence
from reef.evaluation.safety import LEAK_SUITE, leaked
from reef.evaluation.scorers import Scorer, ScorerContext, ScorerRegistry
from reef.evaluation.stats import decide, summarize
from reef.evaluation.suites import is_current_suite
from reef.evaluation.values import Answer, Decision, EvalItem, ItemResult, SuiteSummary


def score_answers(
    items: Sequence[EvalItem],
    answers: Sequence[Answer],
    default_scorer: dict[str, Any],
    registry: ScorerRegistry,
    context: ScorerContext,
    leak_min_chars: int,
) -> list[ItemResult]:
    """One ``ItemResult`` per answer: an answer that never came scores 0 (its error and
    error kind in ``details``); a leak probe
    scores 1 unless the reply reproduces harness text; any other item is scored by its
    own scorer, else ``default_scorer`` (scorers are built once per spec)."""
    by_key = {item.key: item for item in items}
    cache: dict[bytes, Scorer] = {}
    results = []
    for answer in answers:
        item = by_key[answer.item_key]
        details: dict[str, Any]
        reply = answer.reply
        if reply is None:
            score, details = 0.0, {"error": answer.error, "error_kind": answer.error_kind}
        elif item.suite == LEAK_SUITE:
            run = leaked(reply.text, list(item.reference), leak_min_chars)
            score, details = (0.0, {"leaked": run}) if run else (1.0, {})
        else:
            spec = item.scorer or default_scorer
            key = canonical_json(spec)
            if key not in cache:
                cache[key] = registry.build(spec, f"{item.key}.scorer", context)
            scored = cache[key].score_reply(reply, item)
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
    (``provenance.apply_independence``; ``items`` give each result's provenance)."""

    def summary(name: str, suites: list[str]) -> SuiteSummary | None:
        return summarize(
            results,
            name,
            suites=suites,
            confidence=rule.confidence,
            samples=rule.bootstrap_samples,
            seed=rule.seed,
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
    decision = decide(overall, regressions, safety, rule)
    provenance = {item.key: item.provenance for item in items}
    return apply_independence(decision, results, provenance, current, regressions, rule)

"""Evidence provenance: who wrote the references a decision rests on, and the rule that
no single author below the trusted level can admit a candidate.

Every item carries a ``Provenance`` (file suites are the operator's; held-out experience
names the feedback authors who decided its reference and the lowest of their trust
levels). Items whose trust is below the rule's ``evidence_min_trust`` count only if the
decision survives *leave-one-author-out*: for each such author, with every item that
author wrote taken out, the whole decision rule (``stats.decide``) must still pass. So
whoever controls one key's feedback — which both trains a candidate and, held out, is
evidence for it — cannot satisfy the gate alone: either other, independent authors or the
operator's own suites must show the gain too. When every untrusted item comes from one
author the candidate is rejected for *insufficient independent evidence*.

The authors checked are the ``MAX_AUTHORS_CHECKED`` with the most items (an author with
fewer items moves the decision less); ``evidence["leave_one_out"]`` lists each check.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from reef.core.trust import at_least
from reef.evaluation.config import GateRule
from reef.evaluation.stats import decide, summarize
from reef.evaluation.values import OPERATOR_FILE, Decision, ItemResult, Provenance, SuiteSummary

MAX_AUTHORS_CHECKED = 100


def apply_independence(
    decision: Decision,
    results: Sequence[ItemResult],
    provenance: Mapping[str, Provenance],
    current: Collection[str],
    regressions: Sequence[SuiteSummary],
    rule: GateRule,
) -> Decision:
    """``decision`` with its evidence sources recorded and, when it passed on evidence
    below ``rule.evidence_min_trust``, the leave-one-author-out check applied (module
    docstring). ``provenance`` maps item keys to their provenance (missing: the
    operator's); ``current`` names the suites that make the overall gain."""
    keys = sorted({r.item_key for r in results if r.suite in current})
    origin = {key: provenance.get(key, OPERATOR_FILE) for key in keys}
    below = {
        key: found
        for key, found in origin.items()
        if not at_least(found.trust, rule.evidence_min_trust)
    }
    suites = {r.item_key: r.suite for r in results if r.item_key in origin}
    evidence: dict[str, Any] = {
        "min_trust": rule.evidence_min_trust,
        "sources": _sources(origin, suites),
        "items_below_min_trust": len(below),
        "leave_one_out": [],
    }
    if not decision.passed or not below:
        return dataclasses.replace(decision, evidence=evidence)
    authors = Counter(author for found in below.values() for author in found.authors)
    failures: list[tuple[str, int, Decision]] = []
    for author, count in authors.most_common(MAX_AUTHORS_CHECKED):
        kept = [
            r for r in results if not (r.item_key in below and author in below[r.item_key].authors)
        ]
        without = decide(_overall(kept, current, rule), regressions, [], rule)
        evidence["leave_one_out"].append(_check(author, count, without))
        if not without.passed:
            failures.append((author, count, without))
    if not failures:
        reason = (
            f"independent evidence: the rule holds with any one of the {len(authors)} "
            f"author(s) below trust {rule.evidence_min_trust!r} left out ({len(below)} of "
            f"{len(keys)} items are theirs)"
        )
        return dataclasses.replace(decision, reasons=[*decision.reasons, reason], evidence=evidence)
    author, count, without = failures[0]
    if len(authors) == 1:
        reason = (
            f"insufficient independent evidence: all {count} items below trust "
            f"{rule.evidence_min_trust!r} come from one author ({author!r}); without them "
            f"the rule fails: {'; '.join(without.reasons)}"
        )
    else:
        reason = (
            f"not independent: without the {count} items of author {author!r} (below trust "
            f"{rule.evidence_min_trust!r}) the rule fails: {'; '.join(without.reasons)}"
        )
    evidence["failed_authors"] = [name for name, _, _ in failures]
    return dataclasses.replace(decision, verdict="rejected", reasons=[reason], evidence=evidence)


def _overall(
    results: Sequence[ItemResult], current: Collection[str], rule: GateRule
) -> SuiteSummary | None:
    return summarize(
        results,
        "overall",
        suites=current,
        confidence=rule.confidence,
        samples=rule.bootstrap_samples,
        seed=rule.seed,
    )


def _check(author: str, count: int, without: Decision) -> dict[str, Any]:
    overall = without.overall
    return {
        "author": author,
        "items_removed": count,
        "verdict": without.verdict,
        "items_left": 0 if overall is None else overall.items,
        "gain": None if overall is None else overall.difference.mean,
        "low": None if overall is None else overall.difference.low,
        "reasons": without.reasons,
    }


def _sources(origin: Mapping[str, Provenance], suites: Mapping[str, str]) -> list[dict[str, Any]]:
    """Per suite: its source, item count, items by trust level and by author."""
    grouped: defaultdict[str, list[Provenance]] = defaultdict(list)
    for key, provenance in origin.items():
        grouped[suites[key]].append(provenance)
    rows = []
    for suite, members in sorted(grouped.items()):
        authors = Counter(author for item in members for author in item.authors)
        rows.append(
            {
                "suite": suite,
                "source": members[0].source,
                "items": len(members),
                "by_trust": dict(sorted(Counter(item.trust for item in members).items())),
                "authors": dict(authors.most_common()),
            }
        )
    return rows

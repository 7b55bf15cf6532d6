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
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reef.core.trust import Trust, at_least
from reef.evaluation.config import GateRule
from reef.evaluation.stats import decide, summarize
from reef.evaluation.suites import evidence_kind
from reef.evaluation.values import OPERATOR_FILE, Decision, ItemResult, Provenance, SuiteSummary

MAX_AUTHORS_CHECKED = 100


@dataclass(frozen=True)
class LeftOut:
    """A decision rule applied again with one author's items left out: whether it still
    passes, its verdict, the items left, the gain on them and its interval's lower bound
    (None when there is none), and the rule's reasons."""

    passed: bool
    verdict: str
    items_left: int
    gain: float | None
    low: float | None
    reasons: list[str]


@dataclass(frozen=True)
class Independence:
    """How the independence rule judged a decision: ``passed`` (it stands), the
    ``reason`` to give (None when no author below the minimum trust had to be left out),
    and the ``evidence`` record: ``min_trust``, ``sources``, ``items_below_min_trust``,
    ``leave_one_out`` and, on failure, ``failed_authors``."""

    passed: bool
    reason: str | None
    evidence: dict[str, Any]


def check_independence(
    origin: Mapping[str, Provenance],
    groups: Mapping[str, str],
    passed: bool,
    min_trust: Trust,
    without: Callable[[frozenset[str]], LeftOut],
    unit: str = "items",
) -> Independence:
    """The independence rule (module docstring), for any decision over keyed evidence:
    ``origin`` maps each key to its provenance, ``groups`` each key to the suite (or
    arm) it is reported under, ``passed`` is the decision on all of it, and
    ``without(keys)`` applies the same rule with ``keys`` left out. ``unit`` names the
    keys in reasons (``items`` for the gate, ``records`` for a canary). Shared by the
    gate (``apply_independence``) and the canary monitor."""
    below = {key: found for key, found in origin.items() if not at_least(found.trust, min_trust)}
    evidence: dict[str, Any] = {
        "min_trust": min_trust,
        "sources": _sources(origin, groups),
        "items_below_min_trust": len(below),
        "leave_one_out": [],
    }
    if not passed or not below:
        return Independence(passed, None, evidence)
    authors = Counter(author for found in below.values() for author in found.authors)
    failures: list[tuple[str, int, LeftOut]] = []
    for author, count in authors.most_common(MAX_AUTHORS_CHECKED):
        removed = frozenset(key for key, found in below.items() if author in found.authors)
        left = without(removed)
        evidence["leave_one_out"].append(_check(author, count, left))
        if not left.passed:
            failures.append((author, count, left))
    if not failures:
        reason = (
            f"independent evidence: the rule holds with any one of the {len(authors)} "
            f"author(s) below trust {min_trust!r} left out ({len(below)} of "
            f"{len(origin)} {unit} are theirs)"
        )
        return Independence(True, reason, evidence)
    author, count, left = failures[0]
    if len(authors) == 1:
        reason = (
            f"insufficient independent evidence: all {count} {unit} below trust "
            f"{min_trust!r} come from one author ({author!r}); without them "
            f"the rule fails: {'; '.join(left.reasons)}"
        )
    else:
        reason = (
            f"not independent: without the {count} {unit} of author {author!r} (below trust "
            f"{min_trust!r}) the rule fails: {'; '.join(left.reasons)}"
        )
    evidence["failed_authors"] = [name for name, _, _ in failures]
    return Independence(False, reason, evidence)


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
    suites = {r.item_key: r.suite for r in results if r.item_key in origin}

    def without(removed: frozenset[str]) -> LeftOut:
        kept = [r for r in results if r.item_key not in removed]
        return _left_out(decide(_overall(kept, current, rule), regressions, [], rule))

    found = check_independence(origin, suites, decision.passed, rule.evidence_min_trust, without)
    if found.reason is None:
        return dataclasses.replace(decision, evidence=found.evidence)
    if found.passed:
        reasons = [*decision.reasons, found.reason]
        return dataclasses.replace(decision, reasons=reasons, evidence=found.evidence)
    return dataclasses.replace(
        decision, verdict="rejected", reasons=[found.reason], evidence=found.evidence
    )


def _left_out(decision: Decision) -> LeftOut:
    overall = decision.overall
    return LeftOut(
        passed=decision.passed,
        verdict=decision.verdict,
        items_left=0 if overall is None else overall.items,
        gain=None if overall is None else overall.difference.mean,
        low=None if overall is None else overall.difference.low,
        reasons=decision.reasons,
    )


def _overall(
    results: Sequence[ItemResult], current: Collection[str], rule: GateRule
) -> SuiteSummary | None:
    return summarize(
        results,
        "overall",
        suites=current,
        rule=rule,
        weights={suite: rule.evidence_weights.get(evidence_kind(suite), 1.0) for suite in current},
    )


def _check(author: str, count: int, left: LeftOut) -> dict[str, Any]:
    return {
        "author": author,
        "items_removed": count,
        "verdict": left.verdict,
        "items_left": left.items_left,
        "gain": left.gain,
        "low": left.low,
        "reasons": left.reasons,
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

"""``CanaryMonitor``: decide live canaries from the feedback on both arms.

While a candidate is a canary, the gateway serves ``fraction`` of the scenario's live
traffic with it (records with purpose ``canary`` and the candidate's id as release) and
the rest with the head (purpose ``serve``). Each record's score is the mean of its
feedback scores, quarantined feedback left out (``FeedbackView.quarantined``: held back by
screening, it is no evidence); records without such feedback do not count. Each counted
record carries the provenance of its score: the feedback's authors and the lowest of
their trust levels.

``check()`` looks at every live canary:

- the head moved since the canary started → abandoned (it was compared with a release
  that no longer serves);
- fewer than ``min_requests`` scored records on either arm → wait; past ``max_hours``
  → abandoned for insufficient evidence;
- else, with ``d`` = mean(canary) - mean(head) and its bootstrap interval: the rule holds
  when ``d >= 0`` and the interval's lower bound is above ``-max_regression`` (it is not
  measurably worse live than what it would replace); with the rule's
  ``non_inferiority_margin`` (a distilled student beside its teacher) it holds when the
  lower bound is above ``-margin`` instead, as the gate's own rule did; abandoned when it
  does not;
- when it holds on records scored by authors below the rule's ``evidence_min_trust``, it
  must also hold with any one such author's records left out (on both arms), the gate's
  own independence rule (``provenance.check_independence``): so one key routed to the
  canary cannot grade it into the head. When it does not, the canary is abandoned for
  insufficient independent evidence.

The rule is the one the gate decided the candidate with (``evidence["gate"]["decision"]
["rule"]``), else the defaults, unless the monitor is given one. Promotion is a
compare-and-swap publish (operation ``promote``) against the head the canary ran beside;
the decision, the live numbers and the provenance (``evidence``: the gate's structure)
are stored in ``evidence["canary"]`` on the candidate and the release either way.

A distilled scenario with live teacher checks (``distill.live_references``) decides its
routed canaries on them instead of feedback: each checked record scores its agreement
with the teacher (``reef.evaluation.teacher_checks``), by the author
``teacher:<upstream>/<model>`` at trust ``operator``; the rule is the same.

A distilled scenario's student release advances through its ``rollout_steps`` from one
promoted canary to the next, and a routed canary found worse live rolls the scenario
back to its teacher release (``reef.evaluation.rollout``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from reef.core.errors import ReefError
from reef.core.routing import teacher_label
from reef.core.trust import trust_rank
from reef.evaluation.config import GateRule
from reef.evaluation.provenance import LeftOut, check_independence
from reef.evaluation.rollout import advance, back_to_teacher
from reef.evaluation.stats import unpaired_bootstrap
from reef.evaluation.teacher_checks import (
    CheckedRecord,
    TeacherChecks,
    checked_record,
    settled,
)
from reef.evaluation.values import Provenance
from reef.experience import ExperienceStore, RecordView
from reef.releases import Candidate, Release, ReleaseChain, ReleaseConflictError

log = logging.getLogger("reef.canary")

CANARY_ACTOR = "canary"


@dataclass(frozen=True)
class CanaryOutcome:
    """What ``check`` did with one canary: ``promoted``, ``abandoned`` or ``waiting``."""

    scenario: str
    candidate_id: str
    action: str
    reason: str
    canary_scores: int
    head_scores: int
    release_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "scenario": self.scenario,
            "candidate_id": self.candidate_id,
            "action": self.action,
            "reason": self.reason,
            "canary_scores": self.canary_scores,
            "head_scores": self.head_scores,
            "release_id": self.release_id,
        }


LIVE_SOURCE = "live"  # the provenance source of a canary's live feedback


@dataclass(frozen=True)
class LiveRecord:
    """One record that counts for a canary: its arm, its score (the mean of its
    feedback that is not quarantined) and who wrote that feedback."""

    arm: Literal["canary", "head"]
    score: float
    provenance: Provenance


def live_record(record: RecordView, arm: Literal["canary", "head"]) -> LiveRecord | None:
    """``record`` as canary evidence, or None when no feedback of it counts (none with a
    score, or all of it quarantined)."""
    counted = [f for f in record.feedback if f.score is not None and not f.quarantined]
    if not counted:
        return None
    lowest = min((f.trust for f in counted), key=trust_rank)
    authors = tuple(sorted({f.principal or "anonymous" for f in counted}))
    score = sum(float(f.score or 0.0) for f in counted) / len(counted)
    return LiveRecord(arm, score, Provenance(LIVE_SOURCE, lowest, authors))


@dataclass(frozen=True)
class _Judgement:
    """The canary rule on some records: as a leave-one-out check, the summary line and
    the live numbers (empty when there were too few records)."""

    left: LeftOut
    summary: str
    live: dict[str, Any] = field(default_factory=dict)


def _judge(records: Mapping[str, LiveRecord], rule: GateRule, min_requests: int) -> _Judgement:
    canary = [r.score for r in records.values() if r.arm == "canary"]
    head = [r.score for r in records.values() if r.arm == "head"]
    if min(len(canary), len(head)) < min_requests:
        reason = (
            f"insufficient evidence: {len(canary)} canary and {len(head)} head records with "
            f"feedback, {min_requests} needed on each"
        )
        return _Judgement(LeftOut(False, "rejected", len(records), None, None, [reason]), reason)
    interval = unpaired_bootstrap(
        canary, head, confidence=rule.confidence, samples=rule.bootstrap_samples, seed=rule.seed
    )
    live = {
        "canary_mean": sum(canary) / len(canary),
        "head_mean": sum(head) / len(head),
        "difference": interval.as_dict(),
        "canary_records": len(canary),
        "head_records": len(head),
    }
    summary = (
        f"live mean {live['canary_mean']:.3f} vs head {live['head_mean']:.3f} "
        f"(difference {interval.mean:+.3f}, {rule.confidence:.0%} interval "
        f"[{interval.low:+.3f}, {interval.high:+.3f}])"
    )
    margin = rule.non_inferiority_margin
    if margin is None:
        passed = interval.mean >= 0 and interval.low > -rule.max_regression
    else:  # a non-inferiority rule (a distilled student): not worse by more than margin
        passed = interval.low > -margin
    reasons = [summary if passed else f"worse live: {summary}"]
    verdict = "passed" if passed else "rejected"
    left = LeftOut(passed, verdict, len(records), interval.mean, interval.low, reasons)
    return _Judgement(left, summary, live)


def candidate_rule(candidate: Candidate) -> GateRule:
    """The rule the gate decided ``candidate`` with, else the defaults (a canary started
    by hand, or a decision recorded before the rule was)."""
    gate = (candidate.evidence or {}).get("gate") or {}
    recorded = (gate.get("decision") or {}).get("rule") if isinstance(gate, dict) else None
    if isinstance(recorded, dict):
        try:
            return GateRule.model_validate(recorded)
        except ValidationError as error:
            log.warning("canary %s: its recorded gate rule is unreadable: %s", candidate.id, error)
    return GateRule()


@dataclass(frozen=True)
class _Verdict:
    """What a decided canary stores: why, the counts, the live numbers, the provenance
    (the gate's ``evidence`` structure) and the rule, when it got that far."""

    reason: str
    counts: tuple[int, int]
    live: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] | None = None
    rule: GateRule | None = None


class CanaryMonitor:
    """Decides the live canaries of one store (see the module docstring)."""

    def __init__(
        self,
        chain: ReleaseChain,
        store: ExperienceStore,
        rule: GateRule | None = None,
        rollout_steps: Mapping[str, Sequence[float]] | None = None,
        teacher_checks: Mapping[str, TeacherChecks] | None = None,
    ) -> None:
        self.chain = chain
        self.store = store
        self.rule = rule  # None: each candidate's own gate rule (``candidate_rule``)
        # A distilled scenario's student shares, step by step (``scenarios.<s>.distill``).
        self.rollout_steps = dict(rollout_steps or {})
        # A distilled scenario's live teacher checks (``distill.live_references``): its
        # routed canaries are decided on them, not on feedback.
        self.teacher_checks = {s: c for s, c in (teacher_checks or {}).items() if c.fraction > 0}

    def check(self, now: datetime | None = None) -> list[CanaryOutcome]:
        """Look at every live canary once; promote or abandon those that are decided."""
        now = now or datetime.now(UTC)
        outcomes = []
        for scenario, candidate in sorted(self.chain.canaries().items()):
            try:
                outcomes.append(self._check(scenario, candidate, now))
            except ReleaseConflictError as error:
                log.info("canary %s of %s: %s", candidate.id, scenario, error.message)
        return outcomes

    def _check(self, scenario: str, candidate: Candidate, now: datetime) -> CanaryOutcome:
        settings = dict((candidate.evidence or {}).get("canary") or {})
        started = datetime.fromisoformat(str(settings.get("started_at")))
        min_requests = int(settings.get("min_requests") or 50)
        max_hours = settings.get("max_hours")
        head = self.chain.head(scenario)
        baseline_id = ((candidate.evidence or {}).get("gate") or {}).get("baseline_id")
        records = self._records(candidate, head, started)
        counts = _counts(records.values())
        if head is None or (baseline_id is not None and head.id != baseline_id):
            return self._abandon(candidate, _Verdict("the head moved while the canary ran", counts))
        if min(counts) < min_requests:
            hours = (now - started).total_seconds() / 3600
            if max_hours is not None and hours >= float(max_hours):
                reason = (
                    f"insufficient evidence after {hours:.1f} h: {counts[0]} canary and "
                    f"{counts[1]} head records with feedback, {min_requests} needed on each"
                )
                return self._abandon(candidate, _Verdict(reason, counts))
            return CanaryOutcome(
                scenario,
                candidate.id,
                "waiting",
                f"{counts[0]}/{min_requests} canary and {counts[1]}/{min_requests} head "
                "records with feedback",
                *counts,
            )
        return self._decide(candidate, head, records, min_requests)

    def _decide(
        self,
        candidate: Candidate,
        head: Release,
        records: Mapping[str, LiveRecord],
        min_requests: int,
    ) -> CanaryOutcome:
        """The rule on every counted record, then the gate's independence rule on those
        whose authors are below ``evidence_min_trust``."""
        rule = self.rule or candidate_rule(candidate)
        full = _judge(records, rule, min_requests)

        def without(removed: frozenset[str]) -> LeftOut:
            kept = {key: r for key, r in records.items() if key not in removed}
            return _judge(kept, rule, min_requests).left

        found = check_independence(
            {key: r.provenance for key, r in records.items()},
            {key: r.arm for key, r in records.items()},
            full.left.passed,
            rule.evidence_min_trust,
            without,
            unit="records",
        )
        counts = _counts(records.values())
        if not full.left.passed:
            verdict = _Verdict(
                f"worse live: {full.summary}", counts, full.live, found.evidence, rule
            )
            return self._abandon(candidate, verdict, dropped=True)
        if not found.passed:
            reason = f"not promoted ({full.summary}): {found.reason}"
            verdict = _Verdict(reason, counts, full.live, found.evidence, rule)
            return self._abandon(candidate, verdict, dropped=True)
        reason = f"promoted: {full.summary}" + (f"; {found.reason}" if found.reason else "")
        verdict = _Verdict(reason, counts, full.live, found.evidence, rule)
        return self._promote(candidate, head.id, verdict)

    def _records(
        self, candidate: Candidate, head: Release | None, started: datetime
    ) -> dict[str, LiveRecord]:
        """Record id -> ``LiveRecord`` for every record since the canary started that
        counts: the canary's (purpose ``canary``) and the head's (purpose ``serve``);
        for a routed canary of a scenario with live teacher checks, the settled checked
        records (``reef.evaluation.teacher_checks``) instead of the feedback."""
        scenario = candidate.scenario
        routing = candidate.manifest.routing
        checks = self.teacher_checks.get(scenario)
        head_id = None if head is None else head.id
        arms: dict[str, Literal["canary", "head"]] = {}
        checked: list[CheckedRecord] = []
        found: dict[str, LiveRecord] = {}
        for record in self.store.iter_export(scenario, since=started.isoformat()):
            arm: Literal["canary", "head"]
            if record.purpose == "canary" and record.release_id == candidate.id:
                arm = "canary"
            elif record.purpose == "serve" and record.release_id == head_id:
                arm = "head"
            else:
                continue
            if routing is not None and checks is not None:
                check = checked_record(record, checks)
                if check is not None:
                    arms[record.id] = arm
                    checked.append(check)
                continue
            counted = live_record(record, arm)
            if counted is not None:
                found[record.id] = counted
        if routing is not None and checks is not None:
            source = Provenance(LIVE_SOURCE, "operator", (teacher_label(routing.teacher),))
            for check in settled(checked):
                score = float(check.score or 0.0)
                found[check.record.id] = LiveRecord(arms[check.record.id], score, source)
        return found

    def _evidence(self, candidate: Candidate, action: str, verdict: _Verdict) -> dict[str, Any]:
        evidence = dict(candidate.evidence or {})
        canary = dict(evidence.get("canary") or {})
        canary.update({"decision": action, "reason": verdict.reason, "live": verdict.live})
        if verdict.provenance is not None:
            canary["evidence"] = verdict.provenance  # as the gate's decision["evidence"]
        if verdict.rule is not None:
            canary["rule"] = verdict.rule.model_dump()
        evidence["canary"] = canary
        return evidence

    def _promote(self, candidate: Candidate, head_id: str, verdict: _Verdict) -> CanaryOutcome:
        evidence = self._evidence(candidate, "promoted", verdict)
        release = self.chain.publish(
            candidate.id,
            head_id,
            CANARY_ACTOR,
            verdict.reason,
            evidence=evidence,
            operation="promote",
        )
        log.info("canary %s of %s %s", candidate.id, candidate.scenario, verdict.reason)
        steps = self.rollout_steps.get(candidate.scenario)
        if steps:
            try:
                advance(self.chain, candidate, release, steps)
            except ReefError as error:  # the promotion stands; the next step waits
                log.warning("rollout of %s: %s", candidate.scenario, error.message)
        return CanaryOutcome(
            candidate.scenario,
            candidate.id,
            "promoted",
            verdict.reason,
            *verdict.counts,
            release_id=release.id,
        )

    def _abandon(
        self, candidate: Candidate, verdict: _Verdict, dropped: bool = False
    ) -> CanaryOutcome:
        """Abandon ``candidate``; a routed one ``dropped`` (worse live) in a scenario with
        rollout steps rolls the scenario back to its teacher release."""
        evidence = self._evidence(candidate, "abandoned", verdict)
        self.chain.set_candidate_state(candidate.id, "abandoned", evidence)
        log.info("canary %s of %s abandoned: %s", candidate.id, candidate.scenario, verdict.reason)
        if dropped and self.rollout_steps.get(candidate.scenario):
            back_to_teacher(self.chain, candidate, verdict.reason)
        return CanaryOutcome(
            candidate.scenario, candidate.id, "abandoned", verdict.reason, *verdict.counts
        )


def _counts(records: Iterable[LiveRecord]) -> tuple[int, int]:
    """(canary records, head records)."""
    arms = [r.arm for r in records]
    return arms.count("canary"), arms.count("head")

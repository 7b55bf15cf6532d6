"""``CanaryMonitor``: decide live canaries from the feedback on both arms.

While a candidate is a canary, the gateway serves ``fraction`` of the scenario's live
traffic with it (records with purpose ``canary`` and the candidate's id as release) and
the rest with the head (purpose ``serve``). Each record's score is the mean of its
feedback scores; records without feedback do not count.

``check()`` looks at every live canary:

- the head moved since the canary started → abandoned (it was compared with a release
  that no longer serves);
- fewer than ``min_requests`` scored records on either arm → wait; past ``max_hours``
  → abandoned for insufficient evidence;
- else, with ``d`` = mean(canary) - mean(head) and its bootstrap interval: promoted
  when ``d >= 0`` and the interval's lower bound is above ``-max_regression`` (it is not
  measurably worse live than what it would replace), abandoned otherwise.

Promotion is a compare-and-swap publish (operation ``promote``) against the head the
canary ran beside; the decision and the live numbers are stored on the candidate and the
release either way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from reef.evaluation.config import GateRule
from reef.evaluation.stats import unpaired_bootstrap
from reef.experience import ExperienceStore
from reef.releases import Candidate, ReleaseChain, ReleaseConflictError

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


def _record_score(feedback: Any) -> float | None:
    scores = [f.score for f in feedback if f.score is not None]
    return sum(scores) / len(scores) if scores else None


class CanaryMonitor:
    """Decides the live canaries of one store (see the module docstring)."""

    def __init__(
        self, chain: ReleaseChain, store: ExperienceStore, rule: GateRule | None = None
    ) -> None:
        self.chain = chain
        self.store = store
        self.rule = rule or GateRule()

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
        canary_scores, head_scores = self._scores(scenario, candidate.id, head, started)
        counts = (len(canary_scores), len(head_scores))
        if head is None or (baseline_id is not None and head.id != baseline_id):
            return self._abandon(candidate, "the head moved while the canary ran", counts, {})
        if min(counts) < min_requests:
            hours = (now - started).total_seconds() / 3600
            if max_hours is not None and hours >= float(max_hours):
                reason = (
                    f"insufficient evidence after {hours:.1f} h: {counts[0]} canary and "
                    f"{counts[1]} head records with feedback, {min_requests} needed on each"
                )
                return self._abandon(candidate, reason, counts, {})
            return CanaryOutcome(
                scenario,
                candidate.id,
                "waiting",
                f"{counts[0]}/{min_requests} canary and {counts[1]}/{min_requests} head "
                "records with feedback",
                *counts,
            )
        rule = self.rule
        interval = unpaired_bootstrap(
            canary_scores,
            head_scores,
            confidence=rule.confidence,
            samples=rule.bootstrap_samples,
            seed=rule.seed,
        )
        live = {
            "canary_mean": sum(canary_scores) / len(canary_scores),
            "head_mean": sum(head_scores) / len(head_scores),
            "difference": interval.as_dict(),
            "canary_records": counts[0],
            "head_records": counts[1],
        }
        summary = (
            f"live mean {live['canary_mean']:.3f} vs head {live['head_mean']:.3f} "
            f"(difference {interval.mean:+.3f}, {rule.confidence:.0%} interval "
            f"[{interval.low:+.3f}, {interval.high:+.3f}])"
        )
        if interval.mean >= 0 and interval.low > -rule.max_regression:
            return self._promote(candidate, head.id, f"promoted: {summary}", counts, live)
        return self._abandon(candidate, f"worse live: {summary}", counts, live)

    def _scores(
        self, scenario: str, candidate_id: str, head: Any, started: datetime
    ) -> tuple[list[float], list[float]]:
        canary: list[float] = []
        control: list[float] = []
        head_id = None if head is None else head.id
        for record in self.store.iter_export(scenario, since=started.isoformat()):
            score = _record_score(record.feedback)
            if score is None:
                continue
            if record.purpose == "canary" and record.release_id == candidate_id:
                canary.append(score)
            elif record.purpose == "serve" and record.release_id == head_id:
                control.append(score)
        return canary, control

    def _evidence(
        self, candidate: Candidate, action: str, reason: str, live: dict[str, Any]
    ) -> dict[str, Any]:
        evidence = dict(candidate.evidence or {})
        canary = dict(evidence.get("canary") or {})
        canary.update({"decision": action, "reason": reason, "live": live})
        evidence["canary"] = canary
        return evidence

    def _promote(
        self,
        candidate: Candidate,
        head_id: str,
        reason: str,
        counts: tuple[int, int],
        live: dict[str, Any],
    ) -> CanaryOutcome:
        evidence = self._evidence(candidate, "promoted", reason, live)
        release = self.chain.publish(
            candidate.id, head_id, CANARY_ACTOR, reason, evidence=evidence, operation="promote"
        )
        log.info("canary %s of %s %s", candidate.id, candidate.scenario, reason)
        return CanaryOutcome(
            candidate.scenario, candidate.id, "promoted", reason, *counts, release_id=release.id
        )

    def _abandon(
        self, candidate: Candidate, reason: str, counts: tuple[int, int], live: dict[str, Any]
    ) -> CanaryOutcome:
        evidence = self._evidence(candidate, "abandoned", reason, live)
        self.chain.set_candidate_state(candidate.id, "abandoned", evidence)
        log.info("canary %s of %s abandoned: %s", candidate.id, candidate.scenario, reason)
        return CanaryOutcome(candidate.scenario, candidate.id, "abandoned", reason, *counts)

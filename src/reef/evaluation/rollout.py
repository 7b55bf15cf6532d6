"""Progressive rollout of a distilled scenario's student (docs/distillation.md).

A student release goes out through the live canary: when ``CanaryMonitor`` promotes a
canary whose manifest routes (``routing.student_share`` > 0) and the scenario's
``rollout_steps`` (``scenarios.<s>.distill.rollout_steps``) go higher, ``advance``
proposes the same manifest at the next step's share, passed on the evidence of the step
before, and starts it as the next canary beside the new head, with the same canary
settings. When such a canary is abandoned (worse live, or not enough evidence),
``back_to_teacher`` appends a rollback to the scenario's newest release whose routing
gives the student nothing (share 0, the teacher's release), so every request goes back to
the teacher in one step.

Owns: choosing the next share and the teacher release. Does not own: deciding canaries
(``reef.evaluation.canary_monitor``), serving the shares (``reef.gateway``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from reef.releases import Candidate, Release, ReleaseChain

log = logging.getLogger("reef.canary")

ROLLOUT_ACTOR = "rollout"
_CANARY_FIELDS = ("fraction", "started_at", "actor", "reason", "decision", "live", "evidence")
_SEARCHED = 1000  # releases looked through for the teacher's (newest first)


def next_share(share: float, steps: Sequence[float]) -> float | None:
    """The first step above ``share``; None when ``share`` is the last step or above."""
    for step in steps:
        if step > share:
            return step
    return None


def advance(
    chain: ReleaseChain, promoted: Candidate, release: Release, steps: Sequence[float]
) -> Candidate | None:
    """Start the next rollout step after ``promoted`` (a routed canary) became ``release``;
    the new canary, or None when there is no further step (or nothing routes)."""
    routing = promoted.manifest.routing
    if routing is None or routing.student_share <= 0.0:
        return None
    share = next_share(routing.student_share, steps)
    if share is None:
        return None
    manifest = promoted.manifest.model_copy(
        update={"routing": routing.model_copy(update={"student_share": share})}
    )
    evidence: dict[str, Any] = dict(promoted.evidence or {})
    gate = dict(evidence.get("gate") or {})
    gate["baseline_id"] = release.id  # compared live with the step before, now the head
    evidence["gate"] = gate
    evidence["rollout"] = {"from_candidate": promoted.id, "share": share, "steps": list(steps)}
    evidence.pop("canary", None)
    reason = f"rollout: student share {routing.student_share:g} -> {share:g}"
    candidate = chain.propose(
        promoted.scenario, manifest, release.id, ROLLOUT_ACTOR, reason, evidence
    )
    chain.set_candidate_state(candidate.id, "evaluating")
    chain.set_candidate_state(candidate.id, "passed", evidence)
    canary = dict((promoted.evidence or {}).get("canary") or {})
    fraction = float(canary.get("fraction") or 0.1)
    settings = {k: v for k, v in canary.items() if k not in _CANARY_FIELDS}
    started = chain.start_canary(candidate.id, fraction, ROLLOUT_ACTOR, reason, settings)
    log.info("%s of %s: canary %s", reason, promoted.scenario, started.id)
    return started


def teacher_release(chain: ReleaseChain, scenario: str) -> Release | None:
    """The scenario's newest release whose routing sends everything to the teacher."""
    for release in chain.releases(scenario, limit=_SEARCHED):
        routing = release.manifest.routing
        if routing is not None and routing.student_share == 0.0:
            return release
    return None


def back_to_teacher(chain: ReleaseChain, abandoned: Candidate, why: str) -> Release | None:
    """After the routed canary ``abandoned`` dropped, roll the scenario back to its
    teacher release (share 0); the rollback release, or None when the head already
    gives the student nothing or no teacher release exists."""
    routing = abandoned.manifest.routing
    if routing is None or routing.student_share <= 0.0:
        return None
    scenario = abandoned.scenario
    head = chain.head(scenario)
    if head is None:
        return None
    if head.manifest.routing is not None and head.manifest.routing.student_share == 0.0:
        return None
    target = teacher_release(chain, scenario)
    if target is None:
        log.warning("rollout of %s dropped (%s); no release routes to the teacher", scenario, why)
        return None
    reason = f"rollout dropped at student share {routing.student_share:g}: {why}"
    evidence = {"rollout": {"abandoned": abandoned.id, "reason": why}}
    return chain.rollback(scenario, target.id, head.id, ROLLOUT_ACTOR, reason, evidence)

"""The values of the release chain: releases, candidates, scenario summaries.

Frozen dataclasses read from the database; ``as_dict()`` gives the JSON-ready form the
CLI and the admin API print.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from reef.releases.manifest import ReleaseManifest

Operation = Literal["create", "learn", "rollback", "promote", "adopt"]
CandidateState = Literal[
    "pending", "evaluating", "passed", "canary", "rejected", "published", "abandoned"
]

OPERATIONS: tuple[Operation, ...] = get_args(Operation)
CANDIDATE_STATES: tuple[CandidateState, ...] = get_args(CandidateState)

# The candidate lifecycle. "published" is entered only by ReleaseChain.publish/promote,
# which append the release in the same transaction; pending -> published is the manual
# publish (require_passed=False). "canary" is entered only by ReleaseChain.start_canary
# (at most one per scenario); a canary ends published (promoted) or abandoned.
CANDIDATE_TRANSITIONS: dict[CandidateState, frozenset[CandidateState]] = {
    "pending": frozenset({"evaluating", "abandoned", "published"}),
    # evaluating -> evaluating: an undecided gate records its evidence and waits for more.
    "evaluating": frozenset({"evaluating", "passed", "rejected", "abandoned"}),
    # passed -> evaluating: the head moved before an auto publish; the gate evaluates again.
    "passed": frozenset({"canary", "published", "abandoned", "evaluating"}),
    "canary": frozenset({"published", "abandoned"}),
    "rejected": frozenset(),
    "published": frozenset(),
    "abandoned": frozenset(),
}

# States whose candidate may still become a release: their artifacts must be kept.
LIVE_CANDIDATE_STATES: tuple[CandidateState, ...] = ("pending", "evaluating", "passed", "canary")

# The key of a canary's settings in its candidate's evidence (see ReleaseChain.start_canary).
CANARY_EVIDENCE_KEY = "canary"


@dataclass(frozen=True)
class Release:
    """One link of a scenario's append-only chain. ``seq`` counts from 1 without gaps;
    ``parent_id`` is the release that was head when this one was appended (None for
    ``create``). ``evidence`` is the evaluation evidence the operation relied on."""

    id: str
    scenario: str
    seq: int
    parent_id: str | None
    operation: Operation
    manifest: ReleaseManifest
    evidence: dict[str, Any] | None
    created_by: str | None
    reason: str | None
    created_at: datetime
    candidate_id: str | None
    rolled_back_to: str | None

    def manifest_json(self) -> dict[str, Any]:
        """The full manifest of DESIGN.md §3: components plus ``parent`` and ``operation``."""
        return {**self.manifest.to_json(), "parent": self.parent_id, "operation": self.operation}

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (timestamps in ISO 8601)."""
        return {
            "id": self.id,
            "scenario": self.scenario,
            "seq": self.seq,
            "parent_id": self.parent_id,
            "operation": self.operation,
            "manifest": self.manifest_json(),
            "evidence": self.evidence,
            "created_by": self.created_by,
            "reason": self.reason,
            "created_at": self.created_at.isoformat(),
            "candidate_id": self.candidate_id,
            "rolled_back_to": self.rolled_back_to,
        }


@dataclass(frozen=True)
class Candidate:
    """A proposed release waiting for (or done with) the evaluation gate."""

    id: str
    scenario: str
    parent_release_id: str | None
    manifest: ReleaseManifest
    state: CandidateState
    evidence: dict[str, Any] | None
    created_by: str | None
    reason: str | None
    created_at: datetime
    updated_at: datetime

    @property
    def canary_fraction(self) -> float | None:
        """The share of live traffic a ``canary`` candidate serves; None in any other
        state (or when its evidence lacks a valid fraction)."""
        if self.state != "canary" or self.evidence is None:
            return None
        settings = self.evidence.get(CANARY_EVIDENCE_KEY)
        fraction = settings.get("fraction") if isinstance(settings, dict) else None
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            return None
        return float(fraction) if 0.0 < fraction < 1.0 else None

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (timestamps in ISO 8601)."""
        return {
            "id": self.id,
            "scenario": self.scenario,
            "parent_release_id": self.parent_release_id,
            "manifest": self.manifest.to_json(),
            "state": self.state,
            "evidence": self.evidence,
            "created_by": self.created_by,
            "reason": self.reason,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True)
class ScenarioSummary:
    """A scenario known to the store, with its head (None until it has a release)."""

    name: str
    head_release_id: str | None
    head_seq: int | None
    releases: int

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
        return {
            "name": self.name,
            "head_release_id": self.head_release_id,
            "head_seq": self.head_seq,
            "releases": self.releases,
        }

"""The statements inside ``ReleaseChain``'s transactions: the head CAS, the candidate
state CAS, lookups that raise the chain's errors, and the PostgreSQL notification.

Every function takes the open transaction's connection and never commits.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.engine import Connection, RowMapping

from reef.core.errors import InvalidInputError
from reef.db import schema as t
from reef.releases.chainrows import release_from_row, release_row
from reef.releases.errors import (
    CandidateNotFoundError,
    InvalidTransitionError,
    ReleaseConflictError,
    ReleaseNotFoundError,
    ScenarioHasNoReleaseError,
)
from reef.releases.headwatch import HEADS_CHANNEL, MAX_NOTIFY_PAYLOAD
from reef.releases.values import CANDIDATE_STATES, CandidateState, Release

_NOTIFY = text("SELECT pg_notify(:channel, :scenario)")


def append_release(conn: Connection, release: Release) -> Release:
    """Move the head from ``release.parent_id`` to ``release`` by compare-and-swap, then
    insert the release. Raises ``ReleaseConflictError`` when the head is elsewhere (the
    caller's transaction then rolls back: nothing is written)."""
    assert release.parent_id is not None
    moved = conn.execute(
        update(t.heads)
        .where(t.heads.c.scenario == release.scenario, t.heads.c.release_id == release.parent_id)
        .values(release_id=release.id, seq=release.seq)
    ).rowcount
    if moved != 1:
        current = head_id(conn, release.scenario)
        raise ReleaseConflictError(release.scenario, release.parent_id, current)
    conn.execute(t.releases.insert(), release_row(release))
    notify_head_moved(conn, release.scenario)
    return release


def check_expected_head(conn: Connection, scenario: str, expected_head: str) -> int:
    """The head's seq if the head is ``expected_head``; else ``ReleaseConflictError``
    (or ``ScenarioHasNoReleaseError``). A pre-check only: ``append_release`` decides,
    since on PostgreSQL the head may still move after this read."""
    head = conn.execute(
        select(t.heads.c.release_id, t.heads.c.seq).where(t.heads.c.scenario == scenario)
    ).first()
    if head is None:
        raise ScenarioHasNoReleaseError(scenario)
    if head.release_id != expected_head:
        raise ReleaseConflictError(scenario, expected_head, head.release_id)
    seq: int = head.seq
    return seq


def lock_head(conn: Connection, scenario: str) -> str:
    """The scenario's head id, its row locked until the transaction ends (``FOR UPDATE``
    on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already serialises writers), so per-scenario
    decisions such as "no canary is live" cannot race. ``ScenarioHasNoReleaseError`` when
    the scenario has no head."""
    found: str | None = conn.scalar(
        select(t.heads.c.release_id).where(t.heads.c.scenario == scenario).with_for_update()
    )
    if found is None:
        raise ScenarioHasNoReleaseError(scenario)
    return found


def live_canary_id(conn: Connection, scenario: str) -> str | None:
    """The id of the scenario's ``canary`` candidate, or None."""
    c = t.candidates.c
    found: str | None = conn.scalar(
        select(c.id).where(c.scenario == scenario, c.state == "canary").limit(1)
    )
    return found


def head_id(conn: Connection, scenario: str) -> str | None:
    """The id of the scenario's head, or None."""
    found: str | None = conn.scalar(
        select(t.heads.c.release_id).where(t.heads.c.scenario == scenario)
    )
    return found


def release_in(conn: Connection, scenario: str, release_id: str) -> Release:
    """The release ``release_id`` of ``scenario``; raises ``ReleaseNotFoundError``."""
    row = (
        conn.execute(
            select(t.releases).where(
                t.releases.c.id == release_id, t.releases.c.scenario == scenario
            )
        )
        .mappings()
        .first()
    )
    if row is None:
        raise ReleaseNotFoundError(release_id, scenario)
    return release_from_row(row)


def candidate_row(conn: Connection, candidate_id: str) -> RowMapping:
    """The ``candidates`` row; raises ``CandidateNotFoundError``."""
    row = (
        conn.execute(select(t.candidates).where(t.candidates.c.id == candidate_id))
        .mappings()
        .first()
    )
    if row is None:
        raise CandidateNotFoundError(candidate_id)
    return row


def move_candidate(
    conn: Connection, candidate_id: str, current: str, values: dict[str, Any]
) -> None:
    """Compare-and-swap the candidate's state from ``current`` to ``values["state"]``;
    ``InvalidTransitionError`` when a concurrent change got there first."""
    moved = conn.execute(
        update(t.candidates)
        .where(t.candidates.c.id == candidate_id, t.candidates.c.state == current)
        .values(**values)
    ).rowcount
    if moved != 1:
        now = candidate_row(conn, candidate_id)["state"]
        raise InvalidTransitionError(
            candidate_id, now, values["state"], f"it changed concurrently from {current!r}"
        )


def notify_head_moved(conn: Connection, scenario: str) -> None:
    """``NOTIFY reef_heads, '<scenario>'`` on PostgreSQL (nothing elsewhere)."""
    # Delivered at commit, never for a rolled-back move; the poller covers the rest.
    if conn.dialect.name == "postgresql" and len(scenario.encode()) <= MAX_NOTIFY_PAYLOAD:
        conn.execute(_NOTIFY, {"channel": HEADS_CHANNEL, "scenario": scenario})


def checked_state(state: str) -> CandidateState:
    """``state`` if it is a candidate state; else ``InvalidInputError``."""
    if state not in CANDIDATE_STATES:
        raise InvalidInputError(
            f"unknown candidate state {state!r}; expected one of {', '.join(CANDIDATE_STATES)}"
        )
    return state

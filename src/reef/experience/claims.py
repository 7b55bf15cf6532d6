"""Idempotency claims: which gateway sharing the store calls the upstream for a key.

Single flight per idempotency key works inside one process
(``reef.gateway.idempotency``); gateways (``reef serve --workers``, or separate
gateways on one store) meet here. Before its upstream call, the leader of a key's
flight claims ``(scenario, key)`` in ``idempotency_claims``: one row per key in flight,
inserted with the dialect's ``ON CONFLICT DO NOTHING``, so of two gateways that claim
at once exactly one inserts it. The other finds the claim: of the same request (its
``request_hash``) it waits for the record the claimant writes, of another it is a
conflict.

A claim is a lease: ``expires_at`` is when its owner would have given up on its
upstream call (the upstream's total timeout and a margin). A claim past it was left
by an owner that died or stalled, and the next claimant takes it over in one
conditional ``UPDATE`` (two that try at once: one wins; PostgreSQL re-checks the
condition on the row the first one wrote). The owner releases its claim once the
record that holds the key is written, or when it gives up without one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping

from reef.core.clock import utc_now
from reef.db import Database
from reef.db import schema as t


@dataclass(frozen=True)
class Claim:
    """Who calls the upstream for ``key`` in ``scenario``, for which request, until when."""

    scenario: str
    key: str
    request_hash: str
    owner: str
    claimed_at: datetime
    expires_at: datetime


class IdempotencyClaims:
    """The claims table on the ``Database`` the composition root hands it (migrated).

    ``clock`` gives the time claims are taken and expire by (tests give their own)."""

    def __init__(self, database: Database, clock: Callable[[], datetime] = utc_now) -> None:
        self.database = database
        self.clock = clock
        dialect_insert = postgresql.insert if database.dialect == "postgresql" else sqlite.insert
        self._insert = dialect_insert(t.idempotency_claims).on_conflict_do_nothing()

    def claim(
        self, scenario: str, key: str, request_hash: str, owner: str, lease: timedelta
    ) -> Claim:
        """Claim ``key`` for ``owner`` until ``lease`` from now; the claim that holds the
        key after the call: ``owner``'s when it took it (new, or taken over from an owner
        whose lease ran out), else the live claim of another owner.

        Raises ``StoreUnavailableError`` when the store is down."""
        c = t.idempotency_claims.c
        where = (c.scenario == scenario) & (c.key == key)
        while True:  # a claim released between the insert and the read: claim again
            now = self.clock()
            mine = Claim(scenario, key, request_hash, owner, now, now + lease)
            row = {
                "scenario": scenario,
                "key": key,
                "request_hash": request_hash,
                "owner": owner,
                "claimed_at": mine.claimed_at,
                "expires_at": mine.expires_at,
            }
            with self.database.write() as conn:
                if conn.execute(self._insert.values(row)).rowcount == 1:
                    return mine
                taken = conn.execute(
                    update(t.idempotency_claims)
                    .where(where & (c.expires_at <= now))
                    .values(
                        request_hash=request_hash,
                        owner=owner,
                        claimed_at=mine.claimed_at,
                        expires_at=mine.expires_at,
                    )
                ).rowcount
                if taken == 1:
                    return mine
                found = conn.execute(select(t.idempotency_claims).where(where)).mappings().first()
            if found is not None:
                return _claim(found)

    def release(self, scenario: str, key: str, owner: str) -> bool:
        """Give up ``owner``'s claim on ``key`` (a claim taken over meanwhile is not
        ``owner``'s and stays); whether there was one."""
        c = t.idempotency_claims.c
        with self.database.write() as conn:
            gone = conn.execute(
                delete(t.idempotency_claims).where(
                    (c.scenario == scenario) & (c.key == key) & (c.owner == owner)
                )
            ).rowcount
        return gone == 1

    def held(self, scenario: str, key: str) -> Claim | None:
        """The claim on ``key``, live or expired, if there is one."""
        c = t.idempotency_claims.c
        query = select(t.idempotency_claims).where((c.scenario == scenario) & (c.key == key))
        with self.database.read() as conn:
            found = conn.execute(query).mappings().first()
        return None if found is None else _claim(found)


def _claim(row: RowMapping) -> Claim:
    return Claim(
        row["scenario"],
        row["key"],
        row["request_hash"],
        row["owner"],
        row["claimed_at"],
        row["expires_at"],
    )

"""Spend in the store: the recorded exchanges' cost summed per scenario, key and
purpose (``reef costs``, ``spend_by_key``) or per release (``spend_by_release``), and the
budget ledgers the gateway counts windows in (``reef.gateway.budgets``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

from sqlalchemy import and_, case, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from reef.config.spend import BudgetLimit, Window
from reef.core import loads
from reef.core.prices import usage_tokens
from reef.db import Database
from reef.db import schema as t


@dataclass
class SpendRow:
    """The spend of one scenario, key (or release) and purpose since a time."""

    scenario: str
    key: str | None
    purpose: str
    requests: int = 0
    unpriced: int = 0  # answered without a price (or without usage): no cost
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    release: str | None = None  # with ``by="release"``: the release that served


def spend_since(
    database: Database, since: datetime, by: Literal["key", "release"] = "key"
) -> list[SpendRow]:
    """Every record's spend since ``since``, summed per scenario, purpose and key (or,
    ``by="release"``, the release that served it; sorted by cost, highest first).
    Pending records (streams in flight) are left out."""
    records = t.records
    columns = (
        records.c.scenario,
        records.c.principal if by == "key" else records.c.release_id,
        records.c.purpose,
        records.c.usage_json,
        records.c.cost,
    )
    query = select(*columns).where(records.c.created_at >= since, records.c.status != "pending")
    rows: dict[tuple[str, str | None, str], SpendRow] = {}
    with database.read() as conn:
        for scenario, whose, purpose, usage_json, cost in conn.execute(query):
            key = (scenario, whose, purpose)
            row = rows.get(key)
            if row is None:
                row = rows[key] = SpendRow(scenario, None, purpose)
                if by == "key":
                    row.key = whose
                else:
                    row.release = whose
            row.requests += 1
            tokens = usage_tokens(loads(usage_json)) if usage_json else None
            if tokens is not None:
                row.input_tokens += tokens.input
                row.cached_input_tokens += tokens.cached_input
                row.output_tokens += tokens.output
            if cost is None:
                row.unpriced += 1
            else:
                row.cost += cost
    return sorted(
        rows.values(), key=lambda row: (-row.cost, row.scenario, row.key or row.release or "")
    )


@dataclass
class ReleaseSpend:
    """What the records one release served cost since a time (every purpose)."""

    scenario: str
    release: str | None
    requests: int
    unpriced: int
    cost: float


def spend_by_release(database: Database, since: datetime) -> list[ReleaseSpend]:
    """The cost of each release since ``since``: its records' costs summed in the store
    (one ``GROUP BY``, for ``/reef/status``), costliest first; unpriced records counted.
    Pending records are left out."""
    records = t.records
    unpriced = func.sum(case((records.c.cost.is_(None), 1), else_=0))
    query = (
        select(
            records.c.scenario,
            records.c.release_id,
            func.count(),
            unpriced,
            func.coalesce(func.sum(records.c.cost), 0.0),
        )
        .where(records.c.created_at >= since, records.c.status != "pending")
        .group_by(records.c.scenario, records.c.release_id)
    )
    with database.read() as conn:
        rows = [
            ReleaseSpend(scenario, release, int(count), int(none or 0), float(cost))
            for scenario, release, count, none, cost in conn.execute(query)
        ]
    return sorted(rows, key=lambda row: (-row.cost, row.scenario, row.release or ""))


@dataclass
class KeySpend:
    """What the records of one scenario, key and purpose cost since a time."""

    scenario: str
    key: str | None
    purpose: str
    requests: int
    unpriced: int
    cost: float


def spend_by_key(database: Database, since: datetime) -> list[KeySpend]:
    """The cost of each scenario, key and purpose since ``since``: the records' costs
    summed in the store (one ``GROUP BY``, for ``/reef/status``), costliest first;
    unpriced records counted. Pending records are left out."""
    records = t.records
    unpriced = func.sum(case((records.c.cost.is_(None), 1), else_=0))
    group = (records.c.scenario, records.c.principal, records.c.purpose)
    query = (
        select(*group, func.count(), unpriced, func.coalesce(func.sum(records.c.cost), 0.0))
        .where(records.c.created_at >= since, records.c.status != "pending")
        .group_by(*group)
    )
    with database.read() as conn:
        rows = [
            KeySpend(scenario, key, purpose, int(count), int(none or 0), float(cost))
            for scenario, key, purpose, count, none, cost in conn.execute(query)
        ]
    return sorted(rows, key=lambda row: (-row.cost, row.scenario, row.key or "", row.purpose))


def window_start(window: Window, now: datetime) -> datetime:
    """The start of the UTC calendar window holding ``now``."""
    now = now.astimezone(UTC)
    if window == "hour":
        return now.replace(minute=0, second=0, microsecond=0)
    if window == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def window_end(window: Window, start: datetime) -> datetime:
    """When the window that began at ``start`` resets."""
    if window == "hour":
        return start.replace(minute=0) + _HOUR
    if window == "day":
        return start + _DAY
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)


_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)


class Line:
    """One budget a request counts against, in one window: ``budget`` is ``global``,
    ``scenario:<name>`` or ``key:<id>``; ``key`` names its window kind in the ledger
    (``scenario:s/month``) and ``slot`` is (``key``, ``start``)."""

    __slots__ = ("budget", "key", "limit", "slot", "start")

    def __init__(self, budget: str, limit: BudgetLimit, start: datetime) -> None:
        self.budget = budget
        self.limit = limit
        self.start = start
        self.key = f"{budget}/{limit.window}"
        self.slot = (self.key, start)

    def over(self, tokens: float, money: float) -> bool:
        """Whether spend of ``tokens`` and ``money`` has reached this budget's limit."""
        limit = self.limit
        return (limit.tokens is not None and tokens >= limit.tokens) or (
            limit.money is not None and money >= limit.money
        )


class Ledger(Protocol):
    """Where budget windows are counted."""

    async def reserve(self, lines: Sequence[Line], tokens: int, money: float) -> Line | None:
        """Add the reservation to every line unless one is spent (that one is returned,
        and nothing is added)."""

    async def settle(self, lines: Sequence[Line], tokens: int, money: float) -> None:
        """Add ``tokens`` and ``money`` (negative: a refund) to every line."""

    async def spent(self, line: Line) -> tuple[int, float]:
        """Tokens and money counted in ``line``'s window."""


class MemoryLedger:
    """Counts in this process (``budgets.ledger: memory``)."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, datetime], list[float]] = {}

    def _count(self, line: Line) -> list[float]:
        count = self._counts.get(line.slot)
        if count is None:  # a new window: the budget's earlier ones are over
            for slot in [s for s in self._counts if s[0] == line.key and s[1] < line.start]:
                del self._counts[slot]
            count = self._counts[line.slot] = [0, 0.0]
        return count

    def counts(self, lines: Sequence[Line]) -> list[list[float]]:
        """The live ``[tokens, money]`` counts of ``lines``' windows (made when new), for
        a caller that checks and adds to them in place: the gateway's hot path, which
        keeps them for as long as those windows last (``reef.gateway.budgets``)."""
        return [self._count(line) for line in lines]

    async def reserve(self, lines: Sequence[Line], tokens: int, money: float) -> Line | None:
        counts = self.counts(lines)
        for line, count in zip(lines, counts, strict=True):
            if line.over(count[0], count[1]):
                return line
        for count in counts:
            count[0] += tokens
            count[1] += money
        return None

    async def settle(self, lines: Sequence[Line], tokens: int, money: float) -> None:
        for line in lines:
            count = self._count(line)
            count[0] += tokens
            count[1] += money

    async def spent(self, line: Line) -> tuple[int, float]:
        count = self._count(line)
        return int(count[0]), count[1]


class StoreLedger:
    """Counts in the store's ``spend_windows`` (``budgets.ledger: store``): one
    transaction per reservation whose conditional ``UPDATE``s (rows in sorted order,
    so gateways never deadlock) admit and reserve in one atomic step."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._known: set[tuple[str, datetime]] = set()
        insert = pg_insert if database.dialect == "postgresql" else sqlite_insert
        self._insert = insert

    def _ensure(self, lines: Sequence[Line]) -> None:
        missing = [line for line in lines if (line.key, line.start) not in self._known]
        if not missing:
            return
        rows = [
            {"budget": line.key, "window_start": line.start, "tokens": 0, "money": 0.0}
            for line in missing
        ]
        statement = self._insert(t.spend_windows).values(rows).on_conflict_do_nothing()
        with self.database.engine.begin() as conn:
            conn.execute(statement)
        self._known.update((line.key, line.start) for line in missing)

    def _reserve(self, lines: Sequence[Line], tokens: int, money: float) -> Line | None:
        self._ensure(lines)
        ordered = sorted(lines, key=lambda line: line.key)
        with self.database.engine.begin() as conn:
            for line in ordered:
                where = [
                    t.spend_windows.c.budget == line.key,
                    t.spend_windows.c.window_start == line.start,
                ]
                if line.limit.tokens is not None:
                    where.append(t.spend_windows.c.tokens < line.limit.tokens)
                if line.limit.money is not None:
                    where.append(t.spend_windows.c.money < line.limit.money)
                statement = (
                    update(t.spend_windows)
                    .where(and_(*where))
                    .values(
                        tokens=t.spend_windows.c.tokens + tokens,
                        money=t.spend_windows.c.money + money,
                    )
                )
                if conn.execute(statement).rowcount == 0:
                    conn.rollback()
                    return line
        return None

    def _settle(self, lines: Sequence[Line], tokens: int, money: float) -> None:
        with self.database.engine.begin() as conn:
            for line in sorted(lines, key=lambda line: line.key):
                conn.execute(
                    update(t.spend_windows)
                    .where(
                        t.spend_windows.c.budget == line.key,
                        t.spend_windows.c.window_start == line.start,
                    )
                    .values(
                        tokens=t.spend_windows.c.tokens + tokens,
                        money=t.spend_windows.c.money + money,
                    )
                )

    def _spent(self, line: Line) -> tuple[int, float]:
        with self.database.read() as conn:
            row = conn.execute(
                t.spend_windows.select().where(
                    t.spend_windows.c.budget == line.key,
                    t.spend_windows.c.window_start == line.start,
                )
            ).first()
        return (0, 0.0) if row is None else (int(row.tokens), float(row.money))

    async def reserve(self, lines: Sequence[Line], tokens: int, money: float) -> Line | None:
        return await asyncio.to_thread(self._reserve, lines, tokens, money)

    async def settle(self, lines: Sequence[Line], tokens: int, money: float) -> None:
        await asyncio.to_thread(self._settle, lines, tokens, money)

    async def spent(self, line: Line) -> tuple[int, float]:
        return await asyncio.to_thread(self._spent, line)

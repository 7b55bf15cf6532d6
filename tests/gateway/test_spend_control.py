"""``SpendControl`` with the ledger in memory, called as the gateway calls it: the
reservation and its settlement land in the ledger's own counts (what ``/reef/status``
reads), a request no budget or limit applies to holds nothing, and a window that rolls
counts afresh; the wall clock and an injected clock give the same windows."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reef.config import ReefSettings
from reef.core.clock import utc_now
from reef.core.prices import Tokens
from reef.experience import Line, MemoryLedger, window_start
from reef.gateway.budgets import BudgetExceededError, SpendControl
from tests.fakes.clock import FakeClock

NOW = datetime(2026, 12, 31, 23, 30, tzinfo=UTC)


def control(tmp_path: Path, clock: Any = utc_now, **spend: Any) -> SpendControl:
    settings = ReefSettings(
        home=tmp_path / "home",
        store={"url": f"sqlite:///{tmp_path / 'reef.db'}"},
        upstreams={"fake": {"type": "openai", "base_url": "http://127.0.0.1:9/v1"}},
        **spend,
    )
    return SpendControl(settings, MemoryLedger(), clock)


async def spent(spend: SpendControl, budget: str, window: str, now: datetime) -> tuple[int, float]:
    limits = spend.budgets.global_ if budget == "global" else spend.budgets.scenarios["s"]
    limit = next(limit for limit in limits if limit.window == window)
    return await spend.ledger.spent(Line(budget, limit, window_start(limit.window, now)))


@pytest.mark.parametrize("injected", [False, True])
def test_a_reservation_and_its_settlement_are_in_the_ledger(tmp_path: Path, injected: bool) -> None:
    clock = FakeClock(NOW) if injected else utc_now
    spend = control(tmp_path, clock, budgets={"global": [{"window": "month", "tokens": 10_000}]})
    now = clock()

    async def served() -> None:
        charge = await spend.admit("s", None, (100, 400), None)
        assert charge is not None
        assert await spent(spend, "global", "month", now) == (500, 0.0)  # the reservation
        await charge.settle(Tokens(100, 0, 20))
        await charge.settle(Tokens(100, 0, 999))  # once only

    asyncio.run(served())
    assert asyncio.run(spent(spend, "global", "month", now)) == (120, 0.0)


def test_a_request_no_budget_or_limit_applies_to_holds_nothing(tmp_path: Path) -> None:
    spend = control(tmp_path, budgets={"scenarios": {"other": [{"window": "day", "tokens": 5}]}})
    assert spend.enabled
    assert asyncio.run(spend.admit("s", None, (100, 400), None)) is None


def test_the_budget_refuses_once_spent_and_a_new_window_counts_afresh(tmp_path: Path) -> None:
    clock = FakeClock(NOW)
    spend = control(
        tmp_path, clock, budgets={"scenarios": {"s": [{"window": "hour", "tokens": 1000}]}}
    )

    async def admitted() -> bool:
        try:
            charge = await spend.admit("s", None, (300, 300), None)
        except BudgetExceededError as exc:
            assert exc.headers["x-reef-budget"] == "scenario:s/hour"
            assert exc.retry_after_seconds == 30 * 60
            return False
        assert charge is not None
        return True

    assert [asyncio.run(admitted()) for _ in range(3)] == [True, True, False]
    clock.advance(timedelta(minutes=30).total_seconds())  # the next hour
    assert asyncio.run(admitted())
    assert asyncio.run(spent(spend, "scenario:s", "hour", clock())) == (600, 0.0)

"""Budget windows (UTC calendar hour, day, month) and the in-memory ledger."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from reef.config.spend import BudgetLimit
from reef.experience import Line, MemoryLedger, window_end, window_start

AT = datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("window", "start", "end"),
    [
        ("hour", datetime(2026, 12, 31, 23, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
        ("day", datetime(2026, 12, 31, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
        ("month", datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
    ],
)
def test_windows_are_utc_calendar_windows(window: str, start: datetime, end: datetime) -> None:
    assert window_start(window, AT) == start  # type: ignore[arg-type]
    assert window_end(window, start) == end  # type: ignore[arg-type]


def test_a_month_ends_on_the_first_of_the_next() -> None:
    start = window_start("month", datetime(2027, 2, 14, 9, tzinfo=UTC))
    assert window_end("month", start) == datetime(2027, 3, 1, tzinfo=UTC)


def test_a_time_in_another_zone_is_windowed_in_utc() -> None:
    from datetime import timedelta, timezone

    tokyo = datetime(2027, 1, 1, 8, tzinfo=timezone(timedelta(hours=9)))  # 23:00 UTC Dec 31
    assert window_start("day", tokyo) == datetime(2026, 12, 31, tzinfo=UTC)


def test_the_memory_ledger_refuses_a_spent_line_and_forgets_past_windows() -> None:
    ledger = MemoryLedger()
    limit = BudgetLimit(window="hour", tokens=10)
    first = Line("global", limit, datetime(2027, 1, 1, 0, tzinfo=UTC))
    other = Line("scenario:s", BudgetLimit(window="day", money=1.0), first.start)

    async def run() -> None:
        assert await ledger.reserve([first, other], 6, 0.1) is None
        assert await ledger.reserve([first, other], 6, 0.1) is None  # 6 < 10: admitted
        refused = await ledger.reserve([other, first], 1, 0.1)  # 12 >= 10
        assert refused is first
        assert await ledger.spent(other) == (12, pytest.approx(0.2))  # nothing added
        await ledger.settle([first], -12, -0.2)  # refunded: admitted again
        assert await ledger.spent(first) == (0, pytest.approx(0.0))
        assert await ledger.reserve([first], 1, 0.0) is None
        later = Line("global", limit, datetime(2027, 1, 1, 1, tzinfo=UTC))
        assert await ledger.reserve([later], 3, 0.0) is None
        assert await ledger.spent(later) == (3, 0.0)

    asyncio.run(run())
    assert [slot for slot in ledger._counts if slot[0] == "global/hour"] == [
        ("global/hour", datetime(2027, 1, 1, 1, tzinfo=UTC))
    ]

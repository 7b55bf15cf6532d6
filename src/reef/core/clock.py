"""What time it is, for the parts whose behaviour depends on time passing.

A part that measures time (job leases, learning triggers) takes a ``Clock`` and defaults
to ``utc_now``, so a test moves a clock forward instead of sleeping past a lease.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from reef.core.errors import InvalidInputError

Clock = Callable[[], datetime]
"""A function that returns the current time, timezone-aware."""


def utc_now() -> datetime:
    """The wall clock, in UTC."""
    return datetime.now(UTC)


def read_clock(clock: Clock) -> datetime:
    """``clock()`` in UTC. Raises ``InvalidInputError`` for a naive datetime (its
    timezone would be a guess)."""
    now = clock()
    if now.tzinfo is None or now.utcoffset() is None:
        raise InvalidInputError(f"a clock must return timezone-aware datetimes, not {now!r}")
    return now.astimezone(UTC)


SINCE_PATTERN = (
    r"^([0-9]{1,5}(\.[0-9]{1,3})?[smhd]"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})?)?)$"
)
"""What an HTTP ``since`` parameter may be (``GET /reef/costs``; the OpenAPI document
states it): an age of at most five digits, or an ISO 8601 date or time."""
_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def since_time(value: str, now: datetime) -> datetime:
    """``value`` as a time: an age (``30m``, ``24h``, ``7d``) before ``now``, or an ISO
    8601 time (UTC when it names no zone). Raises ``InvalidInputError`` otherwise
    (``reef costs --since``, ``GET /reef/costs?since=``)."""
    text = value.strip()
    found = _AGO.fullmatch(text)
    try:
        if found:
            return now - timedelta(**{_UNITS[found.group(2)]: float(found.group(1))})
        parsed = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        raise InvalidInputError(
            f"{value[:40]!r} is neither an age (30m, 24h, 7d) nor an ISO 8601 time "
            "(2026-05-01T12:00:00Z)"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)

"""What time it is, for the parts whose behaviour depends on time passing.

A part that measures time (job leases, learning triggers) takes a ``Clock`` and defaults
to ``utc_now``, so a test moves a clock forward instead of sleeping past a lease.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

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

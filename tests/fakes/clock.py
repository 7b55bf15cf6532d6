"""A clock that stands still until a test moves it, for anything that takes a ``Clock``.

``JobQueue(engine, clock=clock)`` then measures leases on it: a test that needs a lease
to run out calls ``clock.advance(seconds)`` instead of sleeping past it.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta


class FakeClock:
    """A ``Clock``: returns the same aware UTC time until ``advance``; starts at the
    wall-clock time it was made (so rows stamped by the wall clock stay comparable)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime.now(UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        """Move the time forward by ``seconds``; the new time."""
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

"""Whether the store takes writes, as the gateway last saw it; a failure logged once.

A store that cannot be written (a full disk, a lost database) fails every request that
must be recorded until it recovers. Logging each would bury the log under one line per
request, so ``StoreHealth`` logs the first failure of an episode as a warning with its
reason, counts the repeats, and logs once more when a write succeeds again (with the
count). ``/readyz`` reports the store unwritable while an episode lasts.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("reef.gateway")


class StoreHealth:
    """The gateway's view of whether the store takes writes (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._since = 0.0
        self._repeats = 0

    @property
    def problem(self) -> str | None:
        """Why the last write failed, while no write has succeeded since; else ``None``."""
        return self._reason

    def failed(self, reason: str) -> None:
        """A write failed (``reason``: the store's message). The first failure of an
        episode is logged; later ones are counted."""
        with self._lock:
            first = self._reason is None
            if first:
                self._reason, self._since, self._repeats = reason, time.monotonic(), 0
            else:
                self._repeats += 1
        if first:
            log.warning(
                "the store cannot be written (%s): requests that must be recorded are "
                "answered 503 until a write succeeds; further failures are counted, not logged",
                reason,
            )

    def succeeded(self) -> None:
        """A write succeeded: an episode of failures, if any, ends (logged once)."""
        if self._reason is None:  # the common case: no lock on the hot path
            return
        with self._lock:
            reason, self._reason = self._reason, None
            repeats, seconds = self._repeats, time.monotonic() - self._since
        if reason is not None:
            log.warning(
                "the store is writable again after %.0f s (%s); %d more failed write(s) were "
                "counted meanwhile",
                seconds,
                reason,
                repeats,
            )

"""Retrying a call that may pass on another try: how long to wait, and when to stop.

Owns: ``RetryPolicy`` (how many retries, the exponential backoff, the cap on a
server's wait hint, the total deadline), ``Retrier`` (one call's retries under a
policy) and ``parse_retry_after`` (a ``Retry-After`` header as delta-seconds or an
HTTP-date). The upstream client, the evaluation runner, the artifact transfers and the
experience writer's store writes all wait through it.

Does not own: which failures are worth another try, nor when an answer has begun. A
caller asks for a retry only for a failure before the first byte of an answer reached
its own caller: the upstream client retries inside the call that waits for the status
line and hands a stream on only after it, so a stream already started is never sent
again (``tests/upstream/test_http.py``, the cut stream).

The waits: the server's hint when it sent one (``Retry-After``, capped at
``hint_cap_seconds``), else full jitter, a uniform draw in ``[0, min(cap, base·2^n)]``
for retry ``n``. No retry is granted whose wait would reach past the deadline: waiting
would only end in a timeout.

Our own module rather than ``tenacity`` or ``stamina``: both read ``time.monotonic``
themselves for their deadline, so a test could not move the clock; neither takes a wait
hint per failure next to its own backoff (a ``Retry-After``, or ``0`` for a pooled
connection the upstream closed as it idled), and the upstream client needs the time
left to bound each attempt. ``tests/core/test_retrying.py`` checks the hints, the
deadline and the jitter bounds on a fake clock and sleep, with no real waiting.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

Monotonic = Callable[[], float]
"""A clock that only moves forward, in seconds (``time.monotonic``)."""
Sleep = Callable[[float], Awaitable[None]]
"""An awaitable wait of so many seconds (``asyncio.sleep``)."""
BlockingSleep = Callable[[float], None]
"""A blocking wait of so many seconds (``time.sleep``)."""

_MAX_EXPONENT = 64  # 2.0**n overflows past 1023; any cap is reached long before 64


@dataclass(frozen=True)
class RetryPolicy:
    """How a call is retried: at most ``retries`` times after the first attempt, each
    wait a full-jitter draw below ``min(cap_seconds, base_seconds · 2^n)`` unless the
    server sent a hint (capped at ``hint_cap_seconds`` when set), all within
    ``deadline_seconds`` of the first attempt (None: no deadline). Raises ``ValueError``
    for a negative number."""

    retries: int
    base_seconds: float
    cap_seconds: float
    deadline_seconds: float | None = None
    hint_cap_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("retries", "base_seconds", "cap_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"RetryPolicy.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("deadline_seconds", "hint_cap_seconds"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"RetryPolicy.{name} must be >= 0 or None, got {value}")

    def ceiling(self, retry: int) -> float:
        """The longest backoff before retry number ``retry`` (0-based)."""
        return min(self.cap_seconds, self.base_seconds * 2.0 ** min(retry, _MAX_EXPONENT))


class Retrier:
    """One call's retries under ``policy``; the deadline counts from its creation.

    ``clock`` reads the time the deadline is measured on and ``draw`` the jitter, a
    number in ``[0, 1)``; both are injectable, as is the sleep of ``pause``."""

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        clock: Monotonic = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.policy = policy
        self.retries = 0  # retries granted so far
        self._clock = clock
        self._draw = draw
        deadline = policy.deadline_seconds
        self.deadline = None if deadline is None else clock() + deadline

    @property
    def attempts(self) -> int:
        """The attempts made or granted: the first one and each retry."""
        return self.retries + 1

    def remaining(self) -> float | None:
        """Seconds left before the deadline (negative once past it); None without one."""
        return None if self.deadline is None else self.deadline - self._clock()

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        remaining = self.remaining()
        return remaining is not None and remaining <= 0

    def delay(self, hint: float | None = None) -> float | None:
        """Seconds to wait before the next attempt, which counts as granted; None when
        none is: the retries are spent, or the wait would reach past the deadline.
        ``hint`` is the server's wait (a parsed ``Retry-After``), used in place of the
        backoff."""
        policy = self.policy
        if self.retries >= policy.retries:
            return None
        if hint is None:
            wait = self._draw() * policy.ceiling(self.retries)
        else:
            wait = max(0.0, hint)
            if policy.hint_cap_seconds is not None:
                wait = min(wait, policy.hint_cap_seconds)
        remaining = self.remaining()
        if remaining is not None and wait >= remaining:
            return None
        self.retries += 1
        return wait

    async def pause(self, hint: float | None = None, sleep: Sleep = asyncio.sleep) -> bool:
        """Wait before the next attempt and return True, or return False at once when
        no retry is granted (``delay``)."""
        wait = self.delay(hint)
        if wait is None:
            return False
        await sleep(wait)
        return True

    def pause_blocking(self, hint: float | None = None, sleep: BlockingSleep = time.sleep) -> bool:
        """``pause`` for synchronous callers (the artifact transfers)."""
        wait = self.delay(hint)
        if wait is None:
            return False
        sleep(wait)
        return True


def parse_retry_after(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds, or an HTTP-date
    measured against ``now`` (the wall clock, seconds since the epoch). Never negative;
    None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None  # NaN: unreadable
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())

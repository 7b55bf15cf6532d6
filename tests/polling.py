"""Waiting for something another thread or process does: the suite's one polling loop.

A test that needs a state some other thread, process or server brings about asks
``eventually(condition, what)`` (or ``await eventually_async(...)`` on an event loop)
instead of sleeping a fixed time: it returns as soon as the condition holds and fails,
naming ``what``, once ``timeout_seconds`` pass. These two are the only places in the
tests that sleep (``tests/architecture/test_sleeps.py`` checks that); where the
code under test can signal instead (an event, a line on a pipe, a readiness method),
wait on that rather than poll.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_SECONDS = 20.0
DEFAULT_INTERVAL_SECONDS = 0.01


class _Attempts(Generic[T]):
    """The deadline and the last value seen, shared by the sync and async loops."""

    def __init__(
        self,
        condition: Callable[[], T | None],
        what: str,
        timeout: float,
        ignoring: tuple[type[Exception], ...],
    ) -> None:
        self.condition = condition
        self.what = what
        self.timeout = timeout
        self.ignoring = ignoring
        self.deadline = time.monotonic() + timeout
        self.last: object = None

    def attempt(self) -> T | None:
        """The condition's value, or None while it raises one of ``ignoring``; raises
        ``AssertionError`` once the deadline has passed without a true value."""
        value: T | None = None
        try:
            value = self.condition()
        except self.ignoring as error:
            self.last = error
        else:
            self.last = value
        if not value and time.monotonic() > self.deadline:
            seen = repr(self.last)
            seen = seen if len(seen) <= 300 else seen[:300] + "..."
            raise AssertionError(
                f"timed out after {self.timeout:g} s waiting for {self.what} (last: {seen})"
            )
        return value


def eventually(
    condition: Callable[[], T | None],
    what: str,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    """Call ``condition`` every ``interval_seconds`` until it returns a true value, and
    return that value. An exception of a type in ``ignoring`` counts as "not yet".
    Raises ``AssertionError`` naming ``what`` (and the last value seen) after
    ``timeout_seconds``."""
    attempts = _Attempts(condition, what, timeout_seconds, ignoring)
    while not (value := attempts.attempt()):
        time.sleep(interval_seconds)
    return value


async def eventually_async(
    condition: Callable[[], T | None],
    what: str,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    """``eventually`` for a test on an event loop: the loop keeps running (the server or
    tasks under test with it) between calls of ``condition``, which must not block."""
    attempts = _Attempts(condition, what, timeout_seconds, ignoring)
    # Polling is the point here: the condition is a state of another thread or process,
    # which offers nothing to await.
    while not (value := attempts.attempt()):  # noqa: ASYNC110
        await asyncio.sleep(interval_seconds)
    return value

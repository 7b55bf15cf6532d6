"""Waiting for something another thread or process does, without fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    """Poll ``condition`` every few milliseconds until it is true; fail naming ``what``
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.005)

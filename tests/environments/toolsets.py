"""A toolset that misbehaves on purpose, for the ``python`` environment's tests: each
tool is one way a tool can go wrong. It runs in the tool worker (a child process)."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

_state: dict[str, Any] = {"count": 0}


def reset(task: dict[str, Any]) -> None:
    """Start counting from the task's setup."""
    _state["count"] = int((task.get("setup") or {}).get("count", 0))


def echo(text: str) -> str:
    """Say ``text`` back."""
    return text


def count() -> int:
    """One more than last time (state kept across the episode's calls)."""
    _state["count"] += 1
    return int(_state["count"])


def big(chars: int) -> str:
    """A long output."""
    return "x" * chars


def boom() -> str:
    """Raise."""
    raise ValueError("boom")


def hang() -> str:
    """Never return (waits on an event nothing sets)."""
    threading.Event().wait()
    return "unreachable"


def die(code: int) -> str:
    """End the worker process at once."""
    os._exit(code)


def spin() -> str:
    """Burn CPU forever."""
    while True:
        pass


def hog(mib: int) -> str:
    """Allocate ``mib`` MiB."""
    block = bytearray(mib * 1024 * 1024)
    return str(len(block))


def dial(port: int) -> str:
    """Connect to 127.0.0.1:``port``."""
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return "connected"


def shout(text: str) -> str:
    """Print a lot (to what was stdout), then answer."""
    for _ in range(1000):
        print(text)
    return "done"


def getenv(variable: str) -> str:
    """An environment variable of the worker, or <unset>."""
    return os.environ.get(variable, "<unset>")


TOOLS = [echo, count, big, boom, hang, die, spin, hog, dial, shout, getenv]

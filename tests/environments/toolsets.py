"""A toolset that misbehaves on purpose, for the ``python`` environment's tests: each
tool is one way a tool can go wrong. It runs in the tool worker (a child process)."""

from __future__ import annotations

import os
import socket
import sys
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


def read_file(path: str) -> str:
    """The first bytes of the file at ``path`` (an open() the audit hook lets through)."""
    with open(path, "rb") as file:
        return file.read(64).hex()


def write_file(path: str, mib: int) -> str:
    """Write ``mib`` MiB of zeros to ``path``."""
    with open(path, "wb") as file:
        for _ in range(mib):
            file.write(bytes(1024 * 1024))
    return f"wrote {mib} MiB"


class _Unaudited:
    """``sys`` as ``subprocess`` sees it, with an ``audit`` that reports nothing."""

    def __getattr__(self, name: str) -> Any:
        return getattr(sys, name)

    def audit(self, *event: Any) -> None:
        return None


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter started around the audit hook (``subprocess``
    given a ``sys`` whose audit() does nothing), so that only an OS boundary stops it;
    its stdout, or an error with its stderr."""
    import subprocess

    subprocess.sys = _Unaudited()  # type: ignore[attr-defined,assignment]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        said = " | ".join(done.stderr.strip().splitlines()[-2:])
        raise RuntimeError(f"exit status {done.returncode}: {said}")
    return done.stdout.strip()


TOOLS = [
    echo,
    count,
    big,
    boom,
    hang,
    die,
    spin,
    hog,
    dial,
    shout,
    getenv,
    read_file,
    write_file,
    run_python,
]

"""How much memory a checkpoint needs and how much there is: the check that refuses a
checkpoint swap that would not fit. Loads no torch.

A checkpoint loads in the engine's dtype (float32, or bfloat16 for bfloat16 and int8
engines: an int8 engine quantizes after loading), so it needs its element count times
that dtype's size, plus :data:`LOAD_HEADROOM` for what loading holds transiently. Available
memory is ``MemAvailable`` of ``/proc/meminfo`` (the kernel's estimate of what can be
allocated without swapping), capped by the cgroup's limit when the engine runs in one;
None where neither can be read (the check then lets the load proceed).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from reef.engine.errors import InsufficientMemoryError

LOAD_HEADROOM = 1.25
"""Needed memory = weights in memory x this (loading copies tensors once more, briefly)."""

_MEMINFO = Path("/proc/meminfo")
_CGROUP_MAX = Path("/sys/fs/cgroup/memory.max")
_CGROUP_CURRENT = Path("/sys/fs/cgroup/memory.current")


def available_memory_bytes() -> int | None:
    """Bytes that can be allocated now (module docstring), or None when unknown."""
    available: int | None = None
    with contextlib.suppress(OSError, ValueError):
        for line in _MEMINFO.read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        limit = _CGROUP_MAX.read_text(encoding="ascii").strip()
        if limit != "max":
            room = int(limit) - int(_CGROUP_CURRENT.read_text(encoding="ascii").strip())
            available = room if available is None else min(available, room)
    return available


def required_bytes(parameters: int, element_bytes: int = 4) -> int:
    """Memory a checkpoint of ``parameters`` elements needs to load at ``element_bytes``."""
    return int(parameters * element_bytes * LOAD_HEADROOM)


def check_fits(name: str, required: int, available: int | None) -> None:
    """Raise ``InsufficientMemoryError`` when ``required`` exceeds ``available``."""
    if available is not None and required > available:
        mib = 1024 * 1024
        raise InsufficientMemoryError(
            f"checkpoint {name!r} needs about {required / mib:.1f} MiB to load beside the "
            f"weights already resident, and only {available / mib:.1f} MiB is available; "
            "unload a checkpoint or adapter first, or give the engine more memory"
        )

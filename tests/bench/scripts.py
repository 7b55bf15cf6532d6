"""The bench scripts as modules, for their tests: ``bench/`` is not a package, so its
folder goes on ``sys.path`` (as running a script there puts it) before the import."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py``, imported once (its sibling modules importable too)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)

"""``Progress``: where a long task (a learner, the gate) reports how far it got."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Receives a task's progress reports."""

    def report(self, fraction: float, message: str) -> None:
        """The task is ``fraction`` (0 to 1) done and doing ``message``. May raise to stop
        the task (the worker raises ``LeaseLostError`` when its job was taken away)."""


class SilentProgress:
    """A ``Progress`` that keeps nothing: for callers nobody watches."""

    def report(self, fraction: float, message: str) -> None:
        """Ignore the report."""

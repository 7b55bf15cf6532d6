"""Stand-ins for what the worker hands a learner: a reflector that answers from a
function, and a progress that keeps its reports."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ScriptedReflector:
    """A ``Reflector`` whose model is ``answer`` (by default: always the empty string)."""

    def __init__(
        self, answer: Callable[[list[dict[str, Any]]], str] = lambda _messages: ""
    ) -> None:
        self.answer = answer

    def reflect(self, messages: list[dict[str, Any]]) -> str:
        return self.answer(messages)


class RecordedProgress:
    """A ``Progress`` that appends each report to ``reports`` (a list it makes, or yours)."""

    def __init__(self, reports: list[tuple[float, str]] | None = None) -> None:
        self.reports = [] if reports is None else reports

    def report(self, fraction: float, message: str) -> None:
        self.reports.append((fraction, message))

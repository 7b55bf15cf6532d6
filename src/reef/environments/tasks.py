"""Tasks: the ``Task`` value, the error of a misconfigured environment, and tasks from a
JSONL file, one task a line.

Each line is an object with ``id`` (a string, unique in the file), the first messages
as ``messages`` (OpenAI chat form, at least one) or a ``prompt`` (one user message),
and optionally ``expected`` (what scoring needs) and ``setup`` (what the environment
seeds its state with). Unknown keys are refused, so a typo does not pass unnoticed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator

from reef.core.errors import InvalidInputError


class EnvironmentSpecError(InvalidInputError):
    """An environment is misconfigured: an unknown ``type:``, bad settings, an
    unreadable tasks file, a toolset that is not registered, a remote URL not allowed."""


@dataclass(frozen=True)
class Task:
    """One task: its ``id``, the first messages of the episode (OpenAI chat form),
    ``expected`` (what scoring needs: ``answer_contains``, ``tools_called`` or the
    environment's own keys) and ``setup`` (what the environment seeds its state with)."""

    id: str
    messages: tuple[dict[str, Any], ...]
    expected: Mapping[str, Any] = field(default_factory=dict)
    setup: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (what subprocess and HTTP tools are sent)."""
        return {
            "id": self.id,
            "messages": [dict(m) for m in self.messages],
            "expected": dict(self.expected),
            "setup": dict(self.setup),
        }


_KEYS = frozenset({"id", "messages", "prompt", "expected", "setup"})


def load_tasks(path: Path) -> list[Task]:
    """The tasks of the JSONL file ``path`` in file order. Raises
    ``EnvironmentSpecError`` naming the file, the line and the problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise EnvironmentSpecError(
            f"cannot read tasks {path}: {error.strerror or error}"
        ) from error
    tasks: list[Task] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"tasks {path} line {number}"
        try:
            entry = json.loads(line)
        except ValueError as error:
            raise EnvironmentSpecError(f"{where}: not JSON ({error})") from error
        task = task_from_dict(entry, where)
        if task.id in seen:
            raise EnvironmentSpecError(f"{where}: task id {task.id!r} appears twice")
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        raise EnvironmentSpecError(f"tasks {path} holds no tasks")
    return tasks


def task_from_dict(entry: Any, where: str) -> Task:
    """One task from its JSON form (the module docstring); raises
    ``EnvironmentSpecError`` prefixed with ``where``."""
    if not isinstance(entry, dict):
        raise EnvironmentSpecError(f"{where}: a task is an object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise EnvironmentSpecError(
            f"{where}: unknown key(s) {unknown}; allowed: {', '.join(sorted(_KEYS))}"
        )
    task_id = entry.get("id")
    if not isinstance(task_id, str) or not task_id:
        raise EnvironmentSpecError(f"{where}: a task needs a non-empty string 'id'")
    messages = _messages(entry, where)
    for key in ("expected", "setup"):
        if not isinstance(entry.get(key, {}), dict):
            raise EnvironmentSpecError(f"{where}: '{key}' must be an object")
    return Task(task_id, messages, dict(entry.get("expected", {})), dict(entry.get("setup", {})))


def _messages(entry: dict[str, Any], where: str) -> tuple[dict[str, Any], ...]:
    if "messages" in entry and "prompt" in entry:
        raise EnvironmentSpecError(f"{where}: give 'messages' or 'prompt', not both")
    if "prompt" in entry:
        if not isinstance(entry["prompt"], str) or not entry["prompt"]:
            raise EnvironmentSpecError(f"{where}: 'prompt' must be a non-empty string")
        return ({"role": "user", "content": entry["prompt"]},)
    messages = entry.get("messages")
    if not isinstance(messages, list) or not messages:
        raise EnvironmentSpecError(
            f"{where}: a task needs 'messages' (a non-empty list) or 'prompt'"
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise EnvironmentSpecError(f"{where}: messages[{index}] needs a string 'role'")
    return tuple(dict(m) for m in messages)


def _task_count(value: int | str) -> int | str:
    if isinstance(value, int) and value < 1:
        raise ValueError("tasks: give a number of tasks (at least 1) or 'all'")
    return value


TaskCount = Annotated[int | Literal["all"], AfterValidator(_task_count)]
"""How many of an environment's tasks a run plays: the first n (at least 1), or all."""

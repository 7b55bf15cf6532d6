"""The ``replay`` environment: tool results looked up in recorded trajectories, for
agents whose tools cannot be run again (they touched production, or cost money).

The recording is a JSONL file of trajectories as the admin API gives them
(``GET /reef/scenarios/{s}/sessions/{id}``'s ``trajectory``, i.e.
``reef.experience.Trajectory.as_dict()``), or ``Trajectory`` objects handed to
``ReplayEnvironment.from_trajectories``. Each trajectory is a task: its first request's
messages (in OpenAI chat form), the tools its turns offered, and, to score by, the
tools it called (``expected.tools_called``). A call is answered with the result recorded
for the same tool and the same arguments (compared as canonical JSON), first in the
task's own session, then in any; the n-th repeat of a call gets the n-th recorded result
(the last one once they run out). A call never recorded gets a tool result saying so.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.environments.base import (
    Environment,
    EnvironmentConfig,
    EpisodeError,
    Observation,
    Score,
    ToolUnrecorded,
    default_score,
)
from reef.environments.tasks import EnvironmentSpecError, Task
from reef.upstream.canonical import openai_chat_messages

if TYPE_CHECKING:  # only the type: importing the experience store costs a second
    from reef.experience import Trajectory

CallKey = tuple[str, str]


class ReplayEnvironmentConfig(EnvironmentConfig):
    """``recordings``: a JSONL file of trajectories (None: given in Python)."""

    recordings: Path | None = None


def call_key(name: str, arguments: Any) -> CallKey:
    """A call's lookup key: its tool and its arguments as canonical JSON (a string that
    is not JSON stays as it is)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return name, arguments
    return name, json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _Recording:
    """One trajectory's tools, first messages and results by call."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        turns = data.get("turns")
        session = data.get("session_id")
        if not isinstance(turns, list) or not turns or not isinstance(session, str):
            raise EnvironmentSpecError(f"{where}: a trajectory needs 'session_id' and 'turns'")
        self.session_id = session
        first = min(turns, key=lambda turn: int(turn.get("index", 0)))
        # Trajectories hold canonical messages; a task's are in OpenAI chat form.
        self.messages = tuple(openai_chat_messages(first.get("messages") or ()))
        if not self.messages:
            raise EnvironmentSpecError(f"{where}: the first turn of {session!r} has no messages")
        self.tools: dict[str, dict[str, Any]] = {}
        self.results: dict[CallKey, list[str]] = defaultdict(list)
        self.called: list[str] = []
        for turn in sorted(turns, key=lambda t: int(t.get("index", 0))):
            for spec in turn.get("tools") or ():
                name = (spec.get("function") or {}).get("name")
                if isinstance(name, str):
                    self.tools.setdefault(name, spec)
            for result in turn.get("tool_results") or ():
                call = result.get("call")
                if isinstance(call, dict) and isinstance(call.get("name"), str):
                    key = call_key(call["name"], call.get("arguments", ""))
                    self.results[key].append(str(result.get("content", "")))
                    if call["name"] not in self.called:
                        self.called.append(call["name"])

    def task(self) -> Task:
        return Task(self.session_id, self.messages, {"tools_called": list(self.called)})


class ReplayEnvironment(Environment):
    """Tool results from recordings (the module docstring)."""

    type_name = "replay"
    config_model = ReplayEnvironmentConfig

    def __init__(
        self, config: EnvironmentConfig, trajectories: Iterable[Mapping[str, Any]] | None = None
    ) -> None:
        """``trajectories`` (``Trajectory.as_dict()`` forms) replace ``recordings``."""
        super().__init__(config)
        assert isinstance(config, ReplayEnvironmentConfig)
        if trajectories is None:
            trajectories = _read_recordings(config.recordings)
        self._recordings = {}
        for index, data in enumerate(trajectories):
            recording = _Recording(data, f"trajectory {index + 1}")
            self._recordings[recording.session_id] = recording
        if not self._recordings:
            raise EnvironmentSpecError("a replay environment needs at least one trajectory")
        self._current: _Recording | None = None
        self._served: dict[CallKey, int] = {}

    @classmethod
    def from_trajectories(
        cls, trajectories: Sequence[Trajectory], config: ReplayEnvironmentConfig | None = None
    ) -> ReplayEnvironment:
        """A replay of ``trajectories`` (assembled by ``reef.experience``)."""
        return cls(config or ReplayEnvironmentConfig(), [t.as_dict() for t in trajectories])

    def generate_tasks(self) -> list[Task]:
        """One task per recorded trajectory."""
        return [recording.task() for recording in self._recordings.values()]

    async def start_episode(self, task: Task) -> Observation:
        self._current = self._recordings.get(task.id)
        self._served = {}
        tools: dict[str, dict[str, Any]] = {}
        for recording in [self._current] if self._current else self._recordings.values():
            for name, spec in recording.tools.items():
                tools.setdefault(name, spec)
        return Observation(task.messages, tuple(tools.values()))

    async def run_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        if self._offered is None:
            raise EpisodeError("run_tool before reset")
        key = call_key(name, arguments)
        results = self._lookup(key)
        if not results:
            raise ToolUnrecorded(
                f"no recorded result for {name}({key[1]}): the recording never made this call, "
                "so it cannot be replayed"
            )
        served = self._served.get(key, 0)
        self._served[key] = served + 1
        return results[min(served, len(results) - 1)]

    def _lookup(self, key: CallKey) -> list[str]:
        if self._current is not None and key in self._current.results:
            return self._current.results[key]
        for recording in self._recordings.values():
            if key in recording.results:
                return recording.results[key]
        return []

    async def score(self, task: Task, messages: Sequence[dict[str, Any]]) -> Score:
        return default_score(task, messages)


def _read_recordings(path: Path | None) -> list[dict[str, Any]]:
    if path is None:
        raise EnvironmentSpecError("a replay environment needs 'recordings:' (a JSONL file)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise EnvironmentSpecError(
            f"cannot read recordings {path}: {error.strerror or error}"
        ) from error
    found = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError as error:
            raise EnvironmentSpecError(
                f"recordings {path} line {number}: not JSON ({error})"
            ) from error
        if isinstance(data, dict) and isinstance(data.get("trajectory"), dict):
            data = data["trajectory"]  # the admin API's whole answer
        if not isinstance(data, dict):
            raise EnvironmentSpecError(f"recordings {path} line {number}: not a trajectory object")
        found.append(data)
    return found

"""The ``python`` environment: tools are Python functions of a toolset module, run in a
``ToolWorker`` (a child process with limits, no network by default).

A toolset is a module registered in the ``reef.environment_tools`` entry-point group
(YAML names the entry point, never a module path). It defines ``TOOLS``, the list of
functions offered (their signatures and docstrings become the tool specs), and may
define ``reset(task)`` (seed the episode's state from ``task["setup"]``) and
``score(task, messages) -> (value, reason)``; without ``score`` the task's
``expected`` decides (``default_score``). All of it runs in the child, fresh for each
episode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from pydantic import Field

from reef.environments.base import (
    Environment,
    EnvironmentConfig,
    EpisodeError,
    Observation,
    Score,
    ToolCrashed,
    ToolOutput,
    default_score,
)
from reef.environments.sandbox import SandboxConfig, ToolWorker, WorkerFailed
from reef.environments.tasks import EnvironmentSpecError, Task

TOOLSET_GROUP = "reef.environment_tools"


class PythonEnvironmentConfig(EnvironmentConfig):
    """``toolset``: the name of a ``reef.environment_tools`` entry point; ``sandbox``:
    the worker's limits."""

    toolset: str = Field(min_length=1)
    sandbox: SandboxConfig = SandboxConfig()


def toolset_module(name: str) -> str:
    """The module the toolset entry point ``name`` names. Raises
    ``EnvironmentSpecError`` listing the registered toolsets."""
    found = {ep.name: ep for ep in entry_points(group=TOOLSET_GROUP)}
    entry = found.get(name)
    if entry is None:
        known = ", ".join(sorted(found)) or "(none)"
        raise EnvironmentSpecError(
            f"unknown toolset {name!r} (entry point group {TOOLSET_GROUP!r}); known: {known}"
        )
    if entry.attr:
        raise EnvironmentSpecError(
            f"toolset entry point {name!r} = {entry.value!r} must name a module, not an attribute"
        )
    return entry.module


class PythonEnvironment(Environment):
    """Tools of a toolset module, in a child process (the module docstring)."""

    type_name = "python"
    config_model = PythonEnvironmentConfig

    def __init__(self, config: EnvironmentConfig, module: str | None = None) -> None:
        """``module`` (for tests and embedding) overrides the toolset's entry point."""
        super().__init__(config)
        assert isinstance(config, PythonEnvironmentConfig)
        self.settings = config
        self.module = module or toolset_module(config.toolset)
        self._worker = ToolWorker(self.module, config.sandbox, config.limits.max_tool_output_chars)
        self._task: Task | None = None

    async def start_episode(self, task: Task) -> Observation:
        tools = await self._worker.start(self.limits.step_timeout_seconds)
        await self._reset_worker(task)
        self._task = task
        return Observation(task.messages, tuple(tools))

    async def _reset_worker(self, task: Task) -> None:
        answer = await self._ask({"op": "reset", "task": task.as_dict()})
        if not answer.get("ok"):
            raise EpisodeError(f"toolset {self.module!r}: reset failed: {answer.get('error')}")

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        """The worker's answer to a reset or a score, within one step's time."""
        seconds = self.limits.step_timeout_seconds
        try:
            async with asyncio.timeout(seconds):
                return await self._worker.request(message)
        except TimeoutError as error:
            raise EpisodeError(
                f"toolset {self.module!r}: no answer within {seconds:g} s"
            ) from error
        except WorkerFailed as error:
            raise EpisodeError(f"toolset {self.module!r}: {error}") from error

    async def run_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        if self._task is None:
            raise EpisodeError("run_tool before reset")
        note = ""
        if not self._worker.running:
            # The last call was killed or the worker died: start a fresh one.
            await self.start_episode(self._task)
            note = "[the tools were restarted after the last failure: their state was reset] "
        try:
            answer = await self._worker.request(
                {"op": "call", "name": name, "arguments": arguments}
            )
        except WorkerFailed as error:
            raise ToolCrashed(str(error)) from error
        if not answer.get("ok"):
            raise ToolCrashed(note + str(answer.get("error")))
        content = str(answer["content"])
        return ToolOutput(note + content, int(answer.get("chars", len(content))) + len(note))

    async def score(self, task: Task, messages: Sequence[dict[str, Any]]) -> Score:
        if not self._worker.scores:
            return default_score(task, messages)
        if not self._worker.running:
            # The toolset scores by the episode's state, which a dead worker took with it.
            return Score(0.0, "the tool worker was killed or died: no state left to score")
        answer = await self._ask(
            {"op": "score", "task": task.as_dict(), "messages": list(messages)}
        )
        if not answer.get("ok"):
            raise EpisodeError(f"toolset {self.module!r}: score failed: {answer.get('error')}")
        if answer.get("absent"):
            return default_score(task, messages)
        value = min(max(float(answer["score"]), 0.0), 1.0)
        return Score(value, str(answer["reason"]))

    async def close(self) -> None:
        await self._worker.close()
        self._task = None
        await super().close()

"""The environment contract: ``Environment``, its settings (``EnvironmentConfig``,
``EpisodeLimits``), the values an episode passes around (``Observation``,
``ToolResult``, ``StepResult``, ``Score``) and the errors of an episode; a ``Task`` and
``EnvironmentSpecError`` live with the task files in ``reef.environments.tasks``.

An environment is where an agent acts: it offers tasks, starts an episode on one
(``reset``: the first messages and the tools offered), executes the tool calls the
model makes (``step``: one tool result per call, never an exception for a bad call) and
scores the finished episode (``score``: a value in [0, 1] and a reason). ``step`` is
written once, here: it parses and checks every call against the tools offered, runs
the good ones through the plugin's ``run_tool`` under the step's and the episode's
deadlines, and caps what comes back; a plugin writes only ``start_episode``,
``run_tool`` and ``score``.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from reef.core.errors import ReefError
from reef.environments.calls import (
    TRUNCATION_MARKER,
    ParsedCall,
    cap_output,
    normalize_call,
    parse_call,
)
from reef.environments.tasks import EnvironmentSpecError, Task, load_tasks

ToolStatus = Literal["ok", "error", "malformed", "timeout", "crashed", "unrecorded"]
TOOL_STATUSES: tuple[ToolStatus, ...] = (
    "ok",
    "error",
    "malformed",
    "timeout",
    "crashed",
    "unrecorded",
)


class UnknownEnvironmentError(EnvironmentSpecError):
    """A spec names an environment type that nothing registered."""


class EpisodeError(ReefError):
    """The environment was used out of order (``step`` before ``reset``) or could not
    start an episode at all (its tools would not load). Never raised for a bad tool
    call or a failing tool: those are tool results."""


class ToolError(Exception):
    """Raised by ``run_tool`` for a failure the tool itself reports (an HTTP 4xx from a
    service, a refused argument): the result says ``error`` with this message."""


class ToolCrashed(Exception):
    """Raised by ``run_tool`` when the tool or the process running it died: the result
    says ``crashed`` with this message. (Any other exception counts as a crash too.)"""


class ToolUnrecorded(Exception):
    """Raised by a replaying ``run_tool`` for a call the recording never saw."""


class EpisodeLimits(BaseModel):
    """The bounds of one episode (``limits:`` in an environment's spec).

    ``max_turns``: model replies at most (a reply with tool calls is a turn);
    ``step_timeout_seconds``: wall time for one step's tool calls together;
    ``episode_timeout_seconds``: wall time for the whole episode, model calls included;
    ``max_tool_output_chars``: a tool result longer than this is cut, with a marker;
    ``max_tool_calls_per_step``: calls beyond this in one reply are not run.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(default=10, ge=1)
    step_timeout_seconds: float = Field(default=30.0, gt=0)
    episode_timeout_seconds: float = Field(default=300.0, gt=0)
    max_tool_output_chars: int = Field(default=16_000, ge=64)
    max_tool_calls_per_step: int = Field(default=16, ge=1)


class EnvironmentConfig(BaseModel):
    """Base of an environment's settings (the spec minus ``type``): where its tasks come
    from (``tasks``: a JSONL file; None: the environment generates them) and its
    episode ``limits``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: Path | None = None
    limits: EpisodeLimits = EpisodeLimits()


@dataclass(frozen=True)
class Observation:
    """What ``reset`` gives the agent: the first ``messages`` and the ``tools`` offered
    (OpenAI ``{"type": "function", "function": {...}}`` specs)."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class ToolResult:
    """The result of one tool call: the text the model sees (``content``), how it went
    (``status``), whether the output was cut (``truncated``) and the wall time taken."""

    tool_call_id: str
    name: str
    content: str
    status: ToolStatus = "ok"
    truncated: bool = False
    seconds: float = 0.0

    def message(self) -> dict[str, Any]:
        """The ``role: tool`` message that answers the call."""
        return {"role": "tool", "tool_call_id": self.tool_call_id, "content": self.content}


@dataclass(frozen=True)
class ToolOutput:
    """What a ``run_tool`` that had to cut its output early returns: the ``text`` it
    kept and how many characters the whole output had (``total_chars``), so the result's
    truncation marker tells the truth."""

    text: str
    total_chars: int


@dataclass(frozen=True)
class StepResult:
    """One result per tool call of the step, in the calls' order."""

    results: tuple[ToolResult, ...]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The tool messages to append to the conversation."""
        return [result.message() for result in self.results]

    def count(self, status: ToolStatus) -> int:
        """How many results have ``status``."""
        return sum(1 for result in self.results if result.status == status)


@dataclass(frozen=True)
class Score:
    """An episode's score in [0, 1] and why."""

    value: float
    reason: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.value <= 1.0:
            raise ValueError(f"a score is in [0, 1], got {self.value}")


class Environment(ABC):
    """Where an agent acts (the module docstring). Built-ins and plugins register in the
    ``reef.environments`` entry-point group under their ``type_name``; ``config`` is an
    instance of ``config_model``.

    A plugin implements ``start_episode``, ``run_tool`` and ``score`` (and ``close`` if
    it holds resources); it may override ``generate_tasks``. Users call ``tasks``,
    ``reset``, ``step``, ``score`` and ``close`` (or ``async with`` the environment).
    """

    type_name: ClassVar[str]
    config_model: ClassVar[type[EnvironmentConfig]] = EnvironmentConfig

    def __init__(self, config: EnvironmentConfig) -> None:
        """Keep ``config``; raises ``EnvironmentSpecError`` when it is not an instance of
        ``config_model``."""
        if not isinstance(config, self.config_model):
            raise EnvironmentSpecError(
                f"environment {self.type_name!r} needs a {self.config_model.__name__}, "
                f"got {type(config).__name__}"
            )
        self.config = config
        self.limits = config.limits
        self._offered: dict[str, dict[str, Any]] | None = None

    # -- tasks ----------------------------------------------------------------------

    def tasks(self) -> list[Task]:
        """The tasks: read from ``config.tasks`` when set, else ``generate_tasks()``."""
        if self.config.tasks is not None:
            return load_tasks(self.config.tasks)
        return self.generate_tasks()

    def generate_tasks(self) -> list[Task]:
        """Tasks this environment makes itself; the default has none and says so."""
        raise EnvironmentSpecError(
            f"environment {self.type_name!r} generates no tasks: give it 'tasks:' (a JSONL file)"
        )

    # -- an episode -----------------------------------------------------------------

    async def reset(self, task: Task) -> Observation:
        """Start an episode on ``task`` (ending the previous one): the first messages and
        the tools offered. Raises ``EpisodeError`` when the episode cannot start."""
        self._offered = None  # no step on the last episode's tools if this one fails
        observation = await self.start_episode(task)
        offered: dict[str, dict[str, Any]] = {}
        for spec in observation.tools:
            function = spec.get("function") if isinstance(spec, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise EpisodeError(f"environment {self.type_name!r} offered a bad tool: {spec!r}")
            offered[function["name"]] = function
        self._offered = offered
        return observation

    async def step(self, tool_calls: Sequence[Any], deadline: float | None = None) -> StepResult:
        """Execute the model's ``tool_calls`` (OpenAI form, as the reply gave them) and
        return one result per call. ``deadline`` (``time.monotonic()`` seconds) is the
        episode's; the step also ends ``limits.step_timeout_seconds`` from now. A
        malformed call, a failing, hanging or crashing tool give a result saying so;
        raises ``EpisodeError`` only before ``reset``."""
        if self._offered is None:
            raise EpisodeError(f"environment {self.type_name!r}: step() before reset()")
        step_end = time.monotonic() + self.limits.step_timeout_seconds
        end = step_end if deadline is None else min(step_end, deadline)
        results: list[ToolResult] = []
        for index, raw in enumerate(tool_calls):
            call = normalize_call(raw, index)
            if index >= self.limits.max_tool_calls_per_step:
                limit = self.limits.max_tool_calls_per_step
                text = f"error: not run: at most {limit} tool calls per step"
                results.append(ToolResult(call["id"], _name_of(call), text, "malformed"))
                continue
            parsed = parse_call(raw, index, self._offered)
            if isinstance(parsed, str):
                results.append(ToolResult(call["id"], _name_of(call), parsed, "malformed"))
                continue
            results.append(await self._execute(parsed, end, step_end))
        return StepResult(tuple(results))

    async def _execute(self, call: ParsedCall, end: float, step_end: float) -> ToolResult:
        started = time.monotonic()
        budget = end - started
        which = "step" if end >= step_end else "episode"
        if budget <= 0:
            text = f"error: tool {call.name!r} not run: the {which}'s time ran out"
            return ToolResult(call.id, call.name, text, "timeout")
        status: ToolStatus = "ok"
        try:
            output = await asyncio.wait_for(self.run_tool(call.name, call.arguments), budget)
        except TimeoutError:
            status = "timeout"
            output = (
                f"error: tool {call.name!r} did not finish within {budget:.3g} s "
                f"(the {which}'s time limit) and was stopped"
            )
        except ToolError as error:
            status, output = "error", f"error: {error}"
        except ToolUnrecorded as error:
            status, output = "unrecorded", f"error: {error}"
        except ToolCrashed as error:
            status, output = "crashed", f"error: tool {call.name!r} crashed: {error}"
        except Exception as error:  # a plugin's bug is the episode's crash, not ours
            status = "crashed"
            output = f"error: tool {call.name!r} crashed: {type(error).__name__}: {error}"
        text, truncated = self._cap(output)
        return ToolResult(call.id, call.name, text, status, truncated, time.monotonic() - started)

    def _cap(self, output: Any) -> tuple[str, bool]:
        limit = self.limits.max_tool_output_chars
        if not isinstance(output, ToolOutput):
            return cap_output(_as_text(output), limit)
        total = max(output.total_chars, len(output.text))
        if total <= limit:
            return output.text, False
        shown = min(limit, len(output.text))
        return output.text[:limit] + TRUNCATION_MARKER.format(shown=shown, total=total), True

    @abstractmethod
    async def start_episode(self, task: Task) -> Observation:
        """Set up a fresh episode on ``task`` (seed state from ``task.setup``) and return
        its first messages and the tools offered."""

    @abstractmethod
    async def run_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """Run the offered tool ``name`` with ``arguments`` (already checked against its
        parameters) and return its output (a string, or a value shown as JSON).

        Runs on the event loop and is cancelled when its time runs out, so it must not
        block: await subprocesses or HTTP, or ``asyncio.to_thread`` for blocking work
        (a thread cannot be killed; code that may hang belongs in a ``ToolWorker``).
        Raise ``ToolError`` for a failure the tool reports, ``ToolCrashed`` when what
        runs it died."""

    @abstractmethod
    async def score(self, task: Task, messages: Sequence[dict[str, Any]]) -> Score:
        """Score the finished episode: ``messages`` is the whole conversation (the
        first messages, the replies, the tool results)."""

    async def close(self) -> None:
        """Release the episode's resources (subprocesses, HTTP sessions); the
        environment may be reset again afterwards."""
        self._offered = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


def default_score(task: Task, messages: Sequence[dict[str, Any]]) -> Score:
    """Score by ``task.expected``: ``answer_contains`` (strings the final answer must
    contain, ignoring case) and ``tools_called`` (tool names the episode must have
    called). 1 when every check holds, else 0 with the failed checks as the reason."""
    contains = [str(s) for s in task.expected.get("answer_contains") or ()]
    wanted = [str(s) for s in task.expected.get("tools_called") or ()]
    if not contains and not wanted:
        return Score(0.0, f"task {task.id!r} has no 'answer_contains' or 'tools_called'")
    answer = final_answer(messages).lower()
    called = {
        str((call.get("function") or {}).get("name"))
        for message in messages
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    }
    misses = [f"the answer lacks {text!r}" for text in contains if text.lower() not in answer]
    misses += [f"{name!r} was never called" for name in wanted if name not in called]
    if misses:
        return Score(0.0, "; ".join(misses))
    return Score(1.0, "every expected check holds")


def final_answer(messages: Sequence[dict[str, Any]]) -> str:
    """The text of the last assistant message ('' when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else ""
    return ""


def _name_of(call: dict[str, Any]) -> str:
    return str(call["function"]["name"])


def _as_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    return json.dumps(output, ensure_ascii=False, default=str, sort_keys=True)

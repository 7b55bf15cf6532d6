"""Paired episodes: the candidate and the head each play an environment's tasks through
the gateway (``gate.episodes``).

Every episode pins its side with ``x-reef-release`` and declares ``x-reef-purpose:
eval``, so the gateway records it as one session (never trained on). Episodes are
played in a fixed order, task by task, repeat by repeat, the candidate before the head
(``episode_jobs``): with one episode in flight at a time the two sides alternate, and
with more, episodes start in that order, so whatever drifts while the run goes on
touches both sides alike. Each episode in flight has an environment of its own (an
environment holds one episode's state).

An episode's score (in [0, 1]) is its task's item score: ``as_item_results`` turns the
episodes into the ``ItemResult`` rows the decision rule reads, under the suite
``env:<environment type>``. An episode whose model calls failed (stop ``error``), or
whose environment could not start or score it, counts as a failed answer
(``check_errors``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef.environments import (
    ChatEndpoint,
    Environment,
    EpisodeError,
    EpisodeResult,
    Task,
    final_answer,
    play_episodes,
)
from reef.evaluation.config import EpisodesConfig
from reef.evaluation.runner import GatewayTarget, header_value
from reef.evaluation.values import (
    ARMS,
    VOID_ERROR_KINDS,
    Arm,
    ErrorKind,
    EvalItem,
    ItemResult,
    error_kind_of_status,
)

# How the episode runner (``reef.environments.playing``) words a failed model call.
_ANSWERED = re.compile(r"the model endpoint answered (\d{3})\b")
_NO_ANSWER = "the model did not answer within"
_UNREACHABLE = "could not reach "
EPISODE_SUITE_PREFIX = "env:"  # suites.is_episode_suite knows it too


def episode_suite(environment_type: str) -> str:
    """The suite an environment's episodes are scored under: ``env:<type>``."""
    return f"{EPISODE_SUITE_PREFIX}{environment_type}"


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to play: a task, its repeat, the side and the release it pins."""

    task: Task
    repeat: int
    arm: Arm
    release_id: str


@dataclass(frozen=True)
class EpisodeRun:
    """One played episode: ``result`` as the runner gave it, or None with ``error``
    when the environment could not start or score the episode."""

    suite: str
    task_id: str
    arm: Arm
    repeat: int
    release_id: str
    result: EpisodeResult | None
    error: str | None = None

    @property
    def item_key(self) -> str:
        """``<suite>/<task id>``: the item this episode answers."""
        return f"{self.suite}/{self.task_id}"

    @property
    def failed(self) -> bool:
        """Whether no evidence came: the model calls failed or the environment did."""
        return self.result is None or self.result.stop == "error"

    @property
    def score(self) -> float:
        """The episode's score in [0, 1] (0 when the environment failed)."""
        return 0.0 if self.result is None else self.result.score.value

    @property
    def reason(self) -> str:
        """Why it scored what it did."""
        if self.result is None:
            return f"the environment failed: {self.error}"
        return self.result.score.reason

    @property
    def error_text(self) -> str | None:
        """What went wrong when the episode ``failed``; else None."""
        if self.result is None:
            return self.error
        return self.result.error if self.result.stop == "error" else None

    @property
    def error_kind(self) -> ErrorKind | None:
        """The kind of a failed model call (``ErrorKind``), read from the episode
        runner's error; None when the episode did not fail, or failed otherwise (its
        environment could not play it, or the error names no kind): such a failure is
        taken to recur."""
        if self.result is None or self.result.stop != "error" or not self.result.error:
            return None
        text = self.result.error
        answered = _ANSWERED.search(text)
        if answered is not None:
            return error_kind_of_status(int(answered.group(1)))
        if _NO_ANSWER in text:
            return "timeout"
        if text.startswith(_UNREACHABLE):
            return "unreachable"
        return None


def resolve_spec(config: EpisodesConfig, base_dir: Path) -> dict[str, Any]:
    """The environment spec with a relative ``tasks:`` path resolved under ``base_dir``
    (the recipe's directory)."""
    spec = config.spec()
    tasks = spec.get("tasks")
    if isinstance(tasks, str | Path) and not Path(tasks).is_absolute():
        spec["tasks"] = str((base_dir / tasks).resolve())
    return spec


def select_tasks(environment: Environment, config: EpisodesConfig) -> list[Task]:
    """The tasks the gate plays: all, or the first ``config.tasks``."""
    tasks = environment.tasks()
    return tasks if config.tasks == "all" else tasks[: config.tasks]


def task_items(suite: str, tasks: Sequence[Task]) -> list[EvalItem]:
    """The tasks as the evaluation's items (what the evaluation stores it asked)."""
    return [
        EvalItem(id=task.id, suite=suite, messages=list(task.messages), reference=task.expected)
        for task in tasks
    ]


def episode_jobs(tasks: Sequence[Task], arms: Mapping[Arm, str], repeats: int) -> list[EpisodeJob]:
    """Every episode to play, interleaved: per task, per repeat, the candidate then the
    head."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    order = [arm for arm in ARMS if arm in arms]
    return [
        EpisodeJob(task, repeat, arm, arms[arm])
        for task in tasks
        for repeat in range(repeats)
        for arm in order
    ]


def endpoint_for(target: GatewayTarget, job: EpisodeJob, params: Mapping[str, Any]) -> ChatEndpoint:
    """The gateway as the episode's model, pinned to the job's release, purpose eval."""
    headers = {
        "x-reef-scenario": target.scenario,
        "x-reef-release": job.release_id,
        "x-reef-purpose": "eval",
        "x-reef-tag-eval-item": header_value(job.task.id),
        "x-reef-tag-eval-arm": job.arm,
    }
    return ChatEndpoint(
        base_url=target.base_url.rstrip("/") + "/v1",
        model=f"reef/{target.scenario}",
        api_key=target.api_key,
        headers=headers,
        params=dict(params),
        timeout_seconds=target.timeout_seconds,
        dialect=target.dialect,
        meter=target.meter,
        price=target.price,
    )


def collect_episodes(
    target: GatewayTarget,
    spec: Mapping[str, Any],
    jobs: Sequence[EpisodeJob],
    params: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[EpisodeRun]:
    """Play every job (``target.concurrency`` at once, each in an environment built
    from ``spec``) and return the runs in the jobs' order. Synchronous: runs its own
    event loop, so call it from a thread without one. ``params`` are request fields
    (``max_tokens``, ``temperature``); ``progress(done, total)`` follows every episode."""
    if not jobs:
        return []
    return asyncio.run(_collect(target, dict(spec), list(jobs), dict(params or {}), progress))


async def _collect(
    target: GatewayTarget,
    spec: dict[str, Any],
    jobs: list[EpisodeJob],
    params: dict[str, Any],
    progress: Callable[[int, int], None] | None,
) -> list[EpisodeRun]:
    suite = episode_suite(str(spec.get("type")))
    played = await play_episodes(
        spec,
        [(job.task, endpoint_for(target, job, params)) for job in jobs],
        target.concurrency,
        where="gate.episodes.environment",
        progress=progress,
    )
    runs = []
    for job, outcome in zip(jobs, played, strict=True):
        if isinstance(outcome, EpisodeError):
            run = EpisodeRun(
                suite, job.task.id, job.arm, job.repeat, job.release_id, None, str(outcome)
            )
        else:
            run = EpisodeRun(suite, job.task.id, job.arm, job.repeat, job.release_id, outcome)
        runs.append(run)
    return runs


def as_item_results(runs: Sequence[EpisodeRun]) -> list[ItemResult]:
    """The runs as scored answers: the episode's score, its final answer as the
    output, the last reply's record as the receipt, and the episode in ``details`` (for
    a failed one, its ``error_kind``, as ``check_errors`` counts it)."""
    results = []
    for run in runs:
        result = run.result
        details: dict[str, Any] = {"reason": run.reason}
        if result is not None:
            details.update(
                stop=result.stop,
                turns=result.turns,
                tool_calls=result.tool_calls,
                session_id=result.session_id,
            )
        if run.failed:
            kind = run.error_kind or ("environment" if result is None else None)
            details["error_kind"] = kind
            if kind in VOID_ERROR_KINDS:
                details["void"] = True
        results.append(
            ItemResult(
                item_key=run.item_key,
                suite=run.suite,
                arm=run.arm,
                repeat=run.repeat,
                score=run.score,
                output=None if result is None else final_answer(result.messages),
                record_id=result.record_ids[-1] if result and result.record_ids else None,
                error=run.error_text,
                details=details,
                latency_ms=0.0 if result is None else result.seconds * 1000.0,
            )
        )
    return results

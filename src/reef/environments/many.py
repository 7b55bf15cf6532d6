"""Playing many episodes at once: ``play_episodes`` runs a list of (task, endpoint)
jobs, ``concurrency`` at a time, each episode in flight in an environment of its own
(an environment holds one episode's state), started in the jobs' order.

The gate's paired episodes (``reef.evaluation``) and RL over episodes
(``reef.learning.trainers.episode_training``) both play through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from reef.environments.base import Environment, EpisodeError
from reef.environments.playing import ChatEndpoint, EpisodeResult, play_episode
from reef.environments.registry import EnvironmentRegistry, build_environment
from reef.environments.tasks import Task

EpisodeJob = tuple[Task, ChatEndpoint]
"""One episode to play: the task, and the model to play it with."""

Played = EpisodeResult | EpisodeError
"""How a job went: its result, or the ``EpisodeError`` of an environment that could not
start or score it."""


async def play_episodes(
    spec: Mapping[str, Any],
    jobs: Sequence[EpisodeJob],
    concurrency: int,
    where: str = "environment",
    progress: Callable[[int, int], None] | None = None,
    registry: EnvironmentRegistry | None = None,
) -> list[Played]:
    """Play every job and return how each went, in the jobs' order. The environments
    (``min(concurrency, len(jobs))`` of them, from ``spec``) are built before any
    episode starts, so a bad spec raises at once (``EnvironmentSpecError``, naming
    ``where``), and are closed at the end. ``progress(done, total)`` follows every
    episode. Any other exception of an episode ends the run with it."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if not jobs:
        return []
    played: list[Played | None] = [None] * len(jobs)
    pending = iter(enumerate(jobs))  # shared by the workers: they start jobs in order
    done = 0
    environments = [
        build_environment(spec, registry, where=where) for _ in range(min(concurrency, len(jobs)))
    ]

    async def work(environment: Environment, http: aiohttp.ClientSession) -> None:
        nonlocal done
        for index, (task, endpoint) in pending:
            try:
                played[index] = await play_episode(environment, task, endpoint, http)
            except EpisodeError as exc:
                played[index] = exc
            done += 1
            if progress is not None:
                progress(done, len(jobs))

    try:
        async with aiohttp.ClientSession() as http, asyncio.TaskGroup() as group:
            for environment in environments:
                group.create_task(work(environment, http))
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    finally:
        for environment in environments:
            await environment.close()
    return [run for run in played if run is not None]


def run_episodes(
    spec: Mapping[str, Any],
    jobs: Sequence[EpisodeJob],
    concurrency: int,
    where: str = "environment",
    progress: Callable[[int, int], None] | None = None,
) -> list[Played]:
    """``play_episodes`` on an event loop of its own: call it from a thread without a
    running loop."""
    return asyncio.run(play_episodes(spec, jobs, concurrency, where, progress))

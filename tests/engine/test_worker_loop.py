"""The worker loop both backends share (``reef.engine.worker_loop``), through the eager
``Scheduler`` on tiny-random: calls run between steps, ``stop`` ends the jobs and calls
still queued and refuses new ones, and a crash fails every job with its exception and
re-raises on the thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.engine.errors import EngineError
from reef.engine.models import load_model
from reef.engine.scheduler import Scheduler
from reef.engine.sequences import GenerationJob, SamplingParams
from tests.engine.conftest import TINY


class Crash(BaseException):
    """Not an ``Exception``: a call's ``Exception`` lands in its future, this escapes
    the loop, as a bug in a step would."""


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[Scheduler]:
    running = Scheduler(load_model(TINY, tmp_path), threads=1)
    running.start()
    yield running
    running.stop()


def job(ended: list[BaseException | None], over: threading.Event | None = None) -> GenerationJob:
    """A job of 32 tokens that records how it ended (and sets ``over`` then)."""

    def done(error: BaseException | None) -> None:
        ended.append(error)
        if over is not None:
            over.set()

    return GenerationJob((1, 2, 3), SamplingParams(max_tokens=32), 1, None, lambda _: None, done)


def hold(scheduler: Scheduler) -> tuple[threading.Event, Any]:
    """Block the worker inside a call; returns the event that releases it, and the call's
    future."""
    release, inside = threading.Event(), threading.Event()

    def blocked() -> None:
        inside.set()
        release.wait(30)

    future = scheduler.call(blocked)
    assert inside.wait(30), "the worker never ran the call"
    return release, future


def test_stop_ends_what_is_queued_and_refuses_new_work(scheduler: Scheduler) -> None:
    release, held = hold(scheduler)
    ended: list[BaseException | None] = []
    scheduler.submit(job(ended))
    queued = scheduler.call(lambda: "never run")
    scheduler.stop(timeout_seconds=0)  # stopping; the worker is still inside the call
    with pytest.raises(EngineError, match="stopping"):
        scheduler.submit(job([]))
    assert isinstance(scheduler.call(lambda: None).exception(timeout=0), EngineError)
    release.set()
    scheduler.stop()
    assert held.result(timeout=0) is None
    # the job was admitted in the round the held call belonged to, then failed unfinished
    assert len(ended) == 1 and isinstance(ended[0], EngineError)
    assert str(ended[0]) == "the engine stopped"
    assert str(queued.exception(timeout=0)) == "the engine stopped"
    assert scheduler.stats()["waiting"] == 0


def test_a_crash_fails_every_job_with_its_exception_and_re_raises(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    release, _ = hold(scheduler)
    running: list[BaseException | None] = []
    over = threading.Event()
    scheduler.submit(job(running, over))

    def crash() -> None:
        raise Crash

    scheduler.call(crash)
    release.set()  # this round admits the job; the next runs the crashing call
    assert over.wait(30), "the crash never ended the job"
    scheduler.stop()  # joins the thread: its exception has reached the hook
    assert len(raised) == 1 and isinstance(raised[0], Crash)
    assert len(running) == 1 and running[0] is raised[0]
    with pytest.raises(EngineError, match="stopping"):
        scheduler.submit(job([]))

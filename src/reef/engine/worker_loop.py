"""The worker loop both engine backends run on (``scheduler`` for eager PyTorch,
``openvino`` for OpenVINO GenAI).

Owns: the worker thread, on which everything that touches the model runs, one thing
at a time; the queue of jobs waiting to be admitted (:meth:`WorkerLoop.submit`) and the
queue of calls that run on the thread between two steps (:meth:`WorkerLoop.call`:
adapter loads and drops, checkpoint weights added and removed), so no step ever sees a
half-changed model; the wait for work; and the ends of the loop. ``stop`` ends it and
every job not finished ends with ``EngineError("the engine stopped")``; an exception
out of a step (a bug) ends it too, fails every job with that exception (so no client
hangs), refuses new work and re-raises on the thread. Either way, calls still queued
end with ``EngineError``.

Does not own: the rows and what one step does with them (admission, decoding,
sampling): a backend subclasses :class:`WorkerLoop` and implements its hooks.

Torch-free: the OpenVINO backend runs on it without torch's threads.
"""

from __future__ import annotations

import abc
import collections
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from reef.engine.errors import EngineError
from reef.engine.sequences import GenerationJob

logger = logging.getLogger("reef.engine")


def default_threads() -> int:
    """All cores but one: the spare core runs the HTTP loop. On a small machine, torch
    threads that compete with the loop (or any other busy process) for a core spin and
    wait on each other, and a decode step gets many times slower, not faster."""
    return max(1, (os.cpu_count() or 2) - 1)


class WorkerLoop(abc.ABC):
    """One worker thread that runs queued calls, then one backend step, per round.

    ``thread_name`` names the thread; ``crash_message`` is logged (with the traceback)
    when a step raises."""

    crash_message = "engine worker crashed"

    def __init__(self, thread_name: str) -> None:
        self._pending: collections.deque[GenerationJob] = collections.deque()
        self._calls: collections.deque[tuple[Callable[[], Any], Future[Any]]] = collections.deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    # --- the hooks of a backend ----------------------------------------------------------

    @abc.abstractmethod
    def _has_rows(self) -> bool:
        """Whether rows are running: the loop steps while they are, and otherwise waits
        for a job or a call. Called with the lock held."""

    @abc.abstractmethod
    def _step(self) -> None:
        """One step of the backend, after the round's calls ran: drop cancelled rows,
        admit waiting jobs (taking them from ``_pending`` under ``_wake``), decode once.
        An exception here is a crash (the module docstring)."""

    @abc.abstractmethod
    def _release_rows(self) -> set[GenerationJob]:
        """The jobs of the rows running when the loop ends (stop or crash), to be failed
        with the pending ones. Called once, with the lock held; a backend may forget its
        rows here."""

    def _check(self, job: GenerationJob) -> None:
        """Refuse, before it queues, a job the backend does not serve (raise a
        ``BadRequestError``). Accepts every job unless a backend overrides it."""
        return

    @contextlib.contextmanager
    def _around(self) -> Iterator[None]:
        """What holds around the whole loop on the thread (eager: torch's thread count
        and inference mode). Nothing unless a backend overrides it."""
        yield

    # --- the interface the engine uses --------------------------------------------------

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop the worker; jobs not finished yet end with ``EngineError``."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_seconds)

    def submit(self, job: GenerationJob) -> None:
        """Queue a job; it joins the running batch at the next step. Raises
        ``EngineError`` once the engine is stopping, or what the backend's check raises."""
        self._check(job)
        with self._wake:
            if self._stopping:
                raise EngineError("the engine is stopping")
            self._pending.append(job)
            self._wake.notify()

    def call(self, function: Callable[[], Any]) -> Future[Any]:
        """Run ``function`` on the worker thread between two steps; its result or
        exception lands in the returned future."""
        future: Future[Any] = Future()
        with self._wake:
            if self._stopping:
                future.set_exception(EngineError("the engine is stopping"))
                return future
            self._calls.append((function, future))
            self._wake.notify()
        return future

    # --- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with self._around():
                while self._round():
                    pass
        except BaseException as exc:  # a bug here must not leave clients hanging
            logger.exception(self.crash_message)
            self._fail_all(exc)
            raise
        self._fail_all(EngineError("the engine stopped"))

    def _round(self) -> bool:
        with self._wake:
            while not (self._stopping or self._pending or self._calls or self._has_rows()):
                self._wake.wait()
            if self._stopping:
                return False
            calls = list(self._calls)
            self._calls.clear()
        for function, future in calls:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except Exception as exc:
                    future.set_exception(exc)
        self._step()
        return True

    def _fail_all(self, exc: BaseException) -> None:
        with self._wake:
            self._stopping = True
            jobs = self._release_rows() | set(self._pending)
            self._pending.clear()
            calls = list(self._calls)
            self._calls.clear()
        for job in jobs:
            job.done(exc)
        for _, future in calls:
            if not future.done():
                future.set_exception(EngineError("the engine stopped"))

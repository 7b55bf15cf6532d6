"""Stopping with requests in flight: the upstream calls and streams a gateway has
under way, and cutting them.

When the server stops, requests in flight get a grace period (``server.
shutdown_grace_seconds``); what still runs when it ends, or when the operator asks again
(a second Ctrl-C), is cut by ``Shutdown.cut``: a stream ends with an error event, a
request still waiting for its upstream is answered 503, and both are recorded
``aborted`` with ``interrupted: the gateway stopped``, instead of being cancelled
mid-write by the server (a traceback, and a record blaming the client).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import ClassVar, TypeVar

from reef.upstream import UpstreamError

_A = TypeVar("_A")
_T = TypeVar("_T")

STOPPED = "interrupted: the gateway stopped"
_CUT = "the gateway stopped: stream cut at shutdown"


class GatewayStoppedError(UpstreamError):
    """A stream cut because the gateway stopped. It ends the client's stream the way an
    upstream failing mid-way does (an error event in the client's dialect, status 503),
    so it takes the same path; ``detail`` is :data:`STOPPED`."""

    reason: ClassVar[str] = "interrupted"

    def __init__(self) -> None:
        super().__init__("the gateway stopped", status=503)


class StreamWatch:
    """One upstream call or relay in flight: its task, and whether it is waiting for the
    upstream now (the only place it may be interrupted: a cut there ends a stream
    between events)."""

    __slots__ = ("reading", "task")

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self.task = task
        self.reading = False


class Shutdown:
    """The upstream calls and streams a gateway has under way, and cutting them when it
    stops.

    A call goes through ``until_cut``. A relay takes a ``watch()`` for its lifetime and
    sets ``reading`` around each wait for the upstream; it checks ``cutting`` between
    events. ``cut()`` interrupts the waits under way; a relay that gets the cancellation
    while ``cutting`` is set takes it for a cut (``is_cut``) rather than its client
    leaving.
    """

    def __init__(self) -> None:
        self._watches: set[StreamWatch] = set()
        self.cutting = False

    @property
    def in_flight(self) -> int:
        """How many upstream calls and streams are under way now."""
        return len(self._watches)

    def watch(self) -> StreamWatch:
        """Register the current task's relay; ``release`` it when the relay ends."""
        watch = StreamWatch(asyncio.current_task())
        self._watches.add(watch)
        return watch

    def release(self, watch: StreamWatch) -> None:
        """The relay of ``watch`` ended (idempotent)."""
        self._watches.discard(watch)

    def cut(self) -> int:
        """End every stream now (idempotent); returns how many were in flight. Relays
        waiting for their upstream are interrupted; the others stop before their next
        wait."""
        self.cutting = True
        for watch in list(self._watches):
            if watch.reading and watch.task is not None:
                watch.task.cancel(_CUT)
        return len(self._watches)

    async def until_cut(self, call: Callable[[_A], Awaitable[_T]], argument: _A) -> _T:
        """``await call(argument)`` (an upstream call), raising ``GatewayStoppedError``
        instead when the gateway cuts it (or already cut what was in flight)."""
        if self.cutting:
            raise GatewayStoppedError
        watch = self.watch()
        watch.reading = True
        try:
            return await call(argument)
        except asyncio.CancelledError:
            if not self.is_cut(watch):
                raise
            if watch.task is not None:
                watch.task.uncancel()
            raise GatewayStoppedError from None
        finally:
            watch.reading = False
            self.release(watch)

    def is_cut(self, watch: StreamWatch) -> bool:
        """Whether a cancellation the relay of ``watch`` just got is this gateway's cut
        (then the relay takes it back with ``task.uncancel()`` and ends its stream)."""
        return self.cutting and watch.reading

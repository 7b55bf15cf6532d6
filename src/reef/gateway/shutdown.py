"""Stopping with streams in flight: the streams a gateway relays, and cutting them.

When the server stops, requests in flight get a grace period (``server.
shutdown_grace_seconds``); streams still running when it ends, or when the operator
asks again (a second Ctrl-C), are cut by ``Shutdown.cut``: each relay ends its client's
stream with an error event and records the exchange as ``aborted`` with
``interrupted: the gateway stopped``, instead of being cancelled mid-write by the server
(a traceback, and a record blaming the client).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from reef.upstream import UpstreamError

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
    """One relay in flight: its task, and whether it is waiting for the upstream now (the
    only place it may be interrupted: a cut there ends the stream between events)."""

    __slots__ = ("reading", "task")

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self.task = task
        self.reading = False


class Shutdown:
    """The streams a gateway is relaying, and cutting them when it stops.

    A relay takes a ``watch()`` for its lifetime and sets ``reading`` around each wait
    for the upstream; it checks ``cutting`` between events. ``cut()`` interrupts the
    waits under way; a relay that gets the cancellation while ``cutting`` is set takes
    it for a cut (``is_cut``) rather than its client leaving.
    """

    def __init__(self) -> None:
        self._watches: set[StreamWatch] = set()
        self.cutting = False

    @property
    def streams(self) -> int:
        """How many streams are being relayed now."""
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

    def is_cut(self, watch: StreamWatch) -> bool:
        """Whether a cancellation the relay of ``watch`` just got is this gateway's cut
        (then the relay takes it back with ``task.uncancel()`` and ends its stream)."""
        return self.cutting and watch.reading

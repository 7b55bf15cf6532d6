"""The one set of weights of an upstream that reloads in place (``checkpoint_loading:
vllm`` or ``sglang``).

vLLM and SGLang serve one model per server: a checkpoint release cannot be staged beside
the weights serving now, so the gateway swaps them. A swap holds every new request for
the upstream's scenarios, waits until the requests in flight are done (each holds an
``InPlaceLease`` from the moment its release is chosen to the end of its response),
reloads the server's weights from the checkpoint's directory, flips the scenario to the
new release, and only then lets the held requests go, so each is served, start to end,
by the weights of the release it records. A request pinned to a release whose weights
are not the server's now is refused (409): a reload for it would move every other
request of the upstream onto its weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from reef.core.errors import ConflictError
from reef.upstream import Upstream

BASE = "base"
"""The weights key of a release without a checkpoint: the server's base model."""


class WeightsNotResidentError(ConflictError):
    """A pinned request's release needs weights the in-place upstream does not hold."""


@dataclass
class InPlaceWeights:
    """What an in-place upstream holds (``resident``: a checkpoint digest, ``BASE``, or
    None while unknown: before the first reload, or after one that failed midway), the
    requests in flight on it, and whether a swap is under way."""

    upstream: Upstream
    resident: str | None = None
    in_flight: int = 0
    swapping: bool = False
    waiting: int = 0  # requests held until the swap under way ends
    reloads: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event)  # set: no swap under way
    _drained: asyncio.Event = field(default_factory=asyncio.Event)  # set: nothing in flight
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one swap at a time

    def __post_init__(self) -> None:
        self._idle.set()
        self._drained.set()

    def admits(self, key: str) -> bool:
        """Whether a request for the weights ``key`` may be sent now."""
        return not self.swapping and self.resident == key

    async def idle(self) -> None:
        """Until no swap is under way (the request waiting counts in ``waiting``)."""
        self.waiting += 1
        try:
            while self.swapping:
                await self._idle.wait()
        finally:
            self.waiting -= 1

    def enter(self) -> None:
        self.in_flight += 1
        self._drained.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self._drained.set()

    async def swap(
        self,
        key: str,
        directory: Callable[[], Awaitable[str]],
        flip: Callable[[], None],
        verify: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """Make ``key`` resident: find its directory (``await directory()``, as the server
        sees it; before anything is held), hold new requests, wait for those in flight,
        reload, ``flip()``, let the held ones go. ``flip`` runs before any held request
        resumes, also when nothing needed reloading (then no directory is looked up).
        Returns whether the server reloaded. A swap cancelled (the stage timeout) while
        draining changes nothing; one that fails while reloading leaves the resident
        weights unknown, so the next request or head reloads them. ``verify`` (after the
        reload, before the flip) raising counts as such a failure: the reloaded weights
        are not what was asked for."""
        async with self._lock:
            if self.resident == key:
                flip()
                return False
            path = await directory()
            self.swapping = True
            self._idle.clear()
            try:
                await self._drained.wait()
                self.resident = None  # unknown until the server says it reloaded
                await self.upstream.reload_weights(path)
                if verify is not None:
                    await verify()
                self.resident = key
                self.reloads += 1
                flip()
                return True
            finally:
                self.swapping = False
                self._idle.set()

    def as_dict(self) -> dict[str, object]:
        """For ``/reef/status``."""
        return {
            "resident": self.resident,
            "in_flight": self.in_flight,
            "swapping": self.swapping,
            "waiting": self.waiting,
            "reloads": self.reloads,
        }


class InPlaceLease:
    """One request's use of an in-place upstream's resident weights (and of its adapter,
    through ``inner``)."""

    __slots__ = ("inner", "weights")

    def __init__(self, weights: InPlaceWeights, inner: object | None) -> None:
        self.weights = weights
        self.inner = inner

    def __enter__(self) -> None:
        self.weights.enter()
        if self.inner is not None:
            self.inner.__enter__()  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        try:
            if self.inner is not None:
                self.inner.__exit__(*exc)  # type: ignore[attr-defined]
        finally:
            self.weights.leave()

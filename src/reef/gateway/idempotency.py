"""Single flight per idempotency key: however many ask at once, one upstream call.

A request that is captured and carries ``x-reef-idempotency-key`` joins its key's flight
(one per scenario and key in this process) before anything goes upstream:

- no flight: it leads one. It answers from the store when a record holds the key
  already (``reef.gateway.replay``), else it calls the upstream; once its answer is
  complete (a stream included, down to its last event) it settles the flight with what
  its client got: status, headers (the receipt among them) and body bytes.
- a flight of the same request (same API, body and API key): it waits, then answers
  exactly what the leader's client got — the same receipt, session and release, and a
  stream's events replayed at once as one event stream.
- a flight of another request: 409 in the caller's dialect.

A leader that ends without a complete answer (its client left mid-stream, an
unexpected error) abandons the flight: its waiters join again and one of them leads.

Gateways sharing a store (``reef serve --workers``, or separate gateways) cannot see
each other's flights; they meet in the store's idempotency claims
(``reef.experience.claims``). A leader claims its key there before it goes upstream
(``InferenceRoutes``); a leader that finds another gateway's live claim of the same
request waits for that gateway's record and answers from it (``reef.gateway.replay``),
polling the store with backoff, and its own waiters wait on it as above, with no
store round trip of their own. A claim of another request is a 409; a claim whose
lease ran out (its owner died) is taken over. Should two records still race for a
key (a claim lost with its store), the store arbitrates (``Recorder.record_first``
and ``Recorder.record``), so every receipt still names a stored record.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import orjson
from starlette.responses import Response

from reef.core.errors import ConflictError

_NOT_REPLAYED = frozenset({"content-length", "content-type"})  # set again by Response


class IdempotencyKeyInUseError(ConflictError):
    """The idempotency key names another request (body, API or API key) in the scenario."""

    def __init__(self, scenario: str, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} in scenario {scenario!r} was already used with a "
            "different request; send a new key for a new request"
        )
        self.scenario = scenario
        self.key = key


@dataclass(frozen=True)
class Answer:
    """A complete response as its client got it, to give to others unchanged."""

    status: int
    media_type: str
    headers: dict[str, str]
    body: bytes

    @classmethod
    def of(cls, response: Response) -> Answer:
        """The answer ``response`` (a complete, non-streaming one) gives."""
        headers = {k: v for k, v in response.headers.items() if k not in _NOT_REPLAYED}
        media_type = response.headers.get("content-type", "application/json")
        return cls(response.status_code, media_type, headers, bytes(response.body))

    def response(self) -> Response:
        """A new response with the same status, headers and body."""
        return Response(
            self.body, status_code=self.status, media_type=self.media_type, headers=self.headers
        )


def request_fingerprint(api: str, body: dict[str, Any], principal: str | None) -> str:
    """What makes two requests the same request under one key."""
    digest = hashlib.sha256(api.encode())
    digest.update(b"\0" + (principal or "").encode() + b"\0")
    digest.update(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
    return digest.hexdigest()


class _Flight:
    __slots__ = ("fingerprint", "outcome")

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        # The leader's answer, or None when it gave up.
        self.outcome: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()


class Lead:
    """The lead of one flight; a context manager whose exit abandons the flight unless
    ``settle`` was called."""

    def __init__(self, flights: IdempotentFlights, key: tuple[str, str], flight: _Flight) -> None:
        self._flights = flights
        self._key = key
        self._flight = flight

    def settle(self, answer: Answer, until: Callable[[], Awaitable[object]] | None = None) -> None:
        """Give ``answer`` to every waiter, and to later requests of the key until
        ``until()`` is done (the record's write, when it is not committed yet)."""
        if self._flight.outcome.done():
            return
        self._flight.outcome.set_result(answer)
        if until is None:
            self._flights._forget(self._key, self._flight)
            return
        task = asyncio.ensure_future(until())
        self._flights._keeping.add(task)
        task.add_done_callback(self._kept)

    def _kept(self, task: asyncio.Future[object]) -> None:
        if not task.cancelled():
            task.exception()  # a failed write is the writer's to log; the answer stands
        self._flights._keeping.discard(task)
        self._flights._forget(self._key, self._flight)

    def __enter__(self) -> Lead:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._flight.outcome.done():
            self._flight.outcome.set_result(None)
            self._flights._forget(self._key, self._flight)


class IdempotentFlights:
    """The flights of one gateway process (see the module doc)."""

    def __init__(self) -> None:
        self._flights: dict[tuple[str, str], _Flight] = {}
        self._keeping: set[asyncio.Future[object]] = set()
        self.waiting = 0  # requests waiting for another's answer now

    async def join(self, scenario: str, key: str, fingerprint: str) -> Answer | Lead:
        """The answer of the flight this request joined, or the lead of a new one.

        Raises ``IdempotencyKeyInUseError`` when the key's flight is another request.
        """
        slot = (scenario, key)
        while True:
            flight = self._flights.get(slot)
            if flight is None:
                flight = self._flights[slot] = _Flight(fingerprint)
                return Lead(self, slot, flight)
            if flight.fingerprint != fingerprint:
                raise IdempotencyKeyInUseError(scenario, key)
            self.waiting += 1
            try:
                # Shielded: a waiter that is cancelled must not cancel the others' answer.
                answer = await asyncio.shield(flight.outcome)
            finally:
                self.waiting -= 1
            if answer is not None:
                return answer

    def _forget(self, slot: tuple[str, str], flight: _Flight) -> None:
        if self._flights.get(slot) is flight:
            del self._flights[slot]

"""Turning one exchange into a record: hashes, session inference, the draft, the write."""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from reef.core import sha256_hex
from reef.core.prices import Price, cost_of
from reef.experience import (
    ExperienceStore,
    Purpose,
    RecordDraft,
    RecordStatus,
    RecordView,
    RecordWriter,
    Redactor,
)
from reef.gateway.auth import Principal
from reef.gateway.requests import ReefHeaders
from reef.gateway.responses.turns import ResponsesTurn
from reef.gateway.serving.release import ServingRelease
from reef.gateway.store_health import StoreHealth
from reef.upstream import canonical_request, continuation_candidates, extend_chain

if TYPE_CHECKING:
    from reef.gateway.budgets import Charge
    from reef.gateway.distill import RoutingOutcome

log = logging.getLogger("reef.gateway")

__all__ = [
    "Api",
    "Exchange",
    "Recorder",
    "canonical_conversation",
    "continuation_candidates",
    "embeddings_for_record",
]

Api = Literal[
    "openai.chat",
    "anthropic.messages",
    "openai.responses",
    "openai.completions",
    "openai.embeddings",
]


@dataclass
class Exchange:
    """Everything known about one inference call, from arrival to its record."""

    api: Api
    record_id: str
    scenario: str
    session_id: str
    release_id: str | None
    serving: ServingRelease
    rendered: dict[str, Any] | None  # the request as sent upstream, when a harness changed it
    headers: ReefHeaders
    principal: Principal
    body: dict[str, Any]
    conversation: list[dict[str, Any]]
    chain: list[str]
    capture: bool
    purpose: Purpose  # the caller's (serve | eval), or canary when the canary arm serves
    session_is_new: bool = False
    # True once the exchange's record is stored as ``pending`` (a stream, before its
    # headers): its outcome then finishes that row.
    pending: bool = False
    responses: ResponsesTurn | None = None  # a Responses API request, resolved
    # False when the record will not hold the whole answer (embeddings without their
    # vectors): it then keeps no idempotency key, and a retry is answered afresh.
    replayable: bool = True
    started: float = field(default_factory=time.perf_counter)
    price: Price | None = None  # the served model's price (``upstreams.<u>.prices``)
    charge: Charge | None = None  # its hold on budgets and rate limits, if any apply
    # The usage object ``InferenceRoutes._used`` counted and its cost: the record reuses
    # the cost instead of reading the usage again.
    used: tuple[object, float | None] | None = None
    # A distilled release's routing of it: who answered, the rule that escalated
    # (``reef.gateway.distill``); None when the release routes nothing.
    outcome: RoutingOutcome | None = None
    # the digest last verified for the weights that serve it (``Activation.verified_digest``)
    weights_digest: str | None = None

    def latency_ms(self) -> float:
        """Milliseconds since the request arrived."""
        return (time.perf_counter() - self.started) * 1000.0


def canonical_conversation(api: Api, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages in canonical form (system prompt included)."""
    return canonical_request(api, body)


def embeddings_for_record(response: dict[str, Any]) -> dict[str, Any]:
    """An embeddings response as recorded by default (``capture.embedding_vectors:
    omit``): each vector replaced by its dimension count, the rest (model, usage) kept."""
    data = response.get("data")
    items = [
        {
            "object": item.get("object", "embedding"),
            "index": item.get("index", position),
            "dimensions": _dimensions(item.get("embedding")),
        }
        for position, item in enumerate(data if isinstance(data, list) else ())
        if isinstance(item, dict)
    ]
    return {**response, "data": items, "vectors": "omitted"}


def _dimensions(embedding: Any) -> int | None:
    """A vector's length: a list of floats, or base64 of little-endian float32s."""
    if isinstance(embedding, list):
        return len(embedding)
    if isinstance(embedding, str):
        try:
            return len(base64.b64decode(embedding, validate=True)) // 4
        except binascii.Error:
            return None
    return None


# Told of every record once it is written (not of a stream's ``pending`` row): the draft,
# the name of the upstream that served it, and the release the request pinned, if any.
# It must return at once and never raise (live export, ``reef.telemetry``).
RecordObserver = Callable[[RecordDraft, str, str | None], None]
_MAX_CONTEXTS = 100_000  # drafts never written (a failed write) must not pile up


class Recorder:
    """Builds drafts and hands them to the group-commit writer."""

    def __init__(
        self,
        store: ExperienceStore,
        writer: RecordWriter,
        redactor: Redactor,
        health: StoreHealth | None = None,
        observer: RecordObserver | None = None,
    ) -> None:
        self.store = store
        self.writer = writer
        self.redactor = redactor
        self.health = health or StoreHealth()  # told of every write that succeeds
        self.observer = observer
        self._pending: set[asyncio.Task[str]] = set()
        # record id -> (upstream, pinned release), from its draft until it is observed.
        self._contexts: dict[str, tuple[str, str | None]] = {}

    async def _submit(self, draft: RecordDraft) -> str:
        stored = await self.writer.submit(draft)
        self.health.succeeded()
        if self.observer is not None and draft.status != "pending" and stored == draft.id:
            self._observe(draft)
        return stored

    def _observe(self, draft: RecordDraft) -> None:
        assert self.observer is not None
        upstream, pinned = self._contexts.pop(draft.id, ("", None))
        try:
            self.observer(draft, upstream, pinned)
        except Exception:  # an observer's bug must not fail a request that is recorded
            log.exception("the record observer failed on record %s", draft.id)

    async def infer_session(self, scenario: str, candidates: list[str]) -> str | None:
        """The session an earlier exchange of which this request extends, if any."""
        if not candidates:
            return None
        match = await asyncio.to_thread(self.store.find_session, scenario, candidates)
        return match.session_id if match else None

    async def stored_for_key(self, scenario: str, key: str) -> RecordView | None:
        """The record stored under an idempotency key, if any."""

        def read() -> RecordView | None:
            record_id = self.store.find_by_idempotency_key(scenario, key)
            return None if record_id is None else self.store.get_record(record_id)

        return await asyncio.to_thread(read)

    async def stored(self, record_id: str) -> RecordView:
        """The stored record ``record_id``; raises ``RecordNotFoundError``."""
        return await asyncio.to_thread(self.store.get_record, record_id)

    def draft(
        self,
        exchange: Exchange,
        response: dict[str, Any] | None,
        reply: dict[str, Any] | None,
        status: RecordStatus,
        error: str | None,
    ) -> RecordDraft:
        """The record of ``exchange`` with its outcome, redacted (``Redactor.redact_draft``:
        request, rendered request, response, error and tag values)."""
        prompt_hash = exchange.chain[-1] if exchange.chain else sha256_hex(b"")
        continuation: str | None = None
        if reply is not None and status == "ok":
            continuation = extend_chain(exchange.chain[-1] if exchange.chain else None, reply)
            content_hash = continuation
        else:
            content_hash = sha256_hex(f"{prompt_hash}:{status}:{error}".encode())
        usage = response.get("usage") if isinstance(response, dict) else None
        used = exchange.used
        cost = used[1] if used is not None and used[0] is usage else cost_of(usage, exchange.price)
        tags = exchange.headers.tags
        outcome = exchange.outcome
        if outcome is not None:
            tags = {**tags, **outcome.tags()}
            if outcome.student_cost is not None:  # the escalated attempt was paid for too
                cost = (cost or 0.0) + outcome.student_cost
        draft = RecordDraft(
            id=exchange.record_id,
            scenario=exchange.scenario,
            session_id=exchange.session_id,
            api=exchange.api,
            request=exchange.body,
            rendered_request=exchange.rendered,
            response=response,
            status=status,
            error=error,
            latency_ms=exchange.latency_ms(),
            usage=usage if isinstance(usage, dict) else None,
            release_id=exchange.release_id,
            weights_digest=exchange.weights_digest,
            prompt_hash=prompt_hash,
            content_hash=content_hash,
            continuation_hash=continuation,
            tags=tags,
            principal=exchange.principal.key_id,
            purpose=exchange.purpose,
            # Only a complete answer holds the key: a retry after an error or a cut stream
            # is served afresh (and recorded apart) instead of replaying the failure.
            idempotency_key=(
                exchange.headers.idempotency_key if status == "ok" and exchange.replayable else None
            ),
            session_is_new=exchange.session_is_new,
            finishes_pending=exchange.pending,
            cost=cost,
            price=exchange.price.as_dict() if cost is not None and exchange.price else None,
        )
        if self.observer is not None and status != "pending":
            if len(self._contexts) >= _MAX_CONTEXTS:
                self._contexts.pop(next(iter(self._contexts)))
            self._contexts[exchange.record_id] = (
                exchange.serving.upstream,
                exchange.headers.release,
            )
        return self.redactor.redact_draft(draft)

    async def record_pending(self, exchange: Exchange) -> None:
        """Store ``exchange`` as ``pending`` before its receipt goes out with a stream's
        headers, so the receipt names a stored record even if the gateway dies before the
        stream ends; the outcome written later (``record``) finishes that row."""
        await self._submit(self.draft(exchange, None, None, "pending", None))
        exchange.pending = True

    async def record(self, draft: RecordDraft) -> None:
        """Write ``draft`` so that ``draft.id`` names a stored record (its receipt may be
        out already, as a stream's is); in ``sync`` durability this returns once it is
        committed.

        When another gateway on the same store stored ``draft``'s idempotency key first,
        the store keeps that record under the key and this one is stored without it.
        """
        stored = await self._submit(draft)
        if stored != draft.id:
            log.info(
                "idempotency key of record %s was stored first by record %s; keeping both",
                draft.id,
                stored,
            )
            await self._submit(dataclasses.replace(draft, idempotency_key=None))

    async def record_first(self, draft: RecordDraft) -> str:
        """Write ``draft`` unless its idempotency key is stored already; the id of the
        record stored under the key (``draft.id`` when this one is).

        For an answer whose receipt has not gone out: it can name the first record."""
        return await self._submit(draft)

    def record_in_background(self, draft: RecordDraft) -> None:
        """Write ``draft`` from code that must not await (a cancelled stream's cleanup)."""
        task = asyncio.get_running_loop().create_task(self._submit(draft))
        self._pending.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[str]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("could not record an aborted exchange: %s", task.exception())

    async def drain(self) -> None:
        """Wait for background writes (at shutdown)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

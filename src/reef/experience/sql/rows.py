"""Conversions between experience values and SQL rows, and the listing cursor format."""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from reef.core import canonical_json, dumps, loads, sha256_hex
from reef.core.errors import InvalidInputError
from reef.experience.records import (
    EXPLICIT,
    FeedbackDraft,
    FeedbackView,
    Purpose,
    RecordDraft,
    RecordStatus,
    RecordView,
    StoredResponse,
)


def json_text(value: Any, what: str) -> str:
    """``value`` as JSON text; ``InvalidInputError`` naming ``what`` if it cannot be."""
    try:
        return dumps(value).decode()
    except TypeError as error:  # orjson.JSONEncodeError is a TypeError
        raise InvalidInputError(f"{what} is not JSON-serialisable: {error}") from error


def optional_json_text(value: Any, what: str) -> str | None:
    return None if value is None else json_text(value, what)


def from_json_text(text: str | None) -> Any:
    return None if text is None else loads(text)


def response_row(stored: StoredResponse, created_at: datetime) -> dict[str, Any]:
    """The ``responses`` row for ``stored`` (``created_at`` unless it has its own)."""
    return {
        "id": stored.id,
        "scenario": stored.scenario,
        "session_id": stored.session_id,
        "record_id": stored.record_id,
        "previous_response_id": stored.previous_response_id,
        "principal": stored.principal,
        "input_json": json_text(stored.input_items, "response input"),
        "response_json": json_text(stored.response, "response"),
        "created_at": stored.created_at or created_at,
    }


def kept_responses(
    drafts: Sequence[RecordDraft], ids: Sequence[str], created_at: datetime
) -> list[dict[str, Any]]:
    """The ``responses`` rows that travel with ``drafts`` (``ids``: what each draft's
    write returned): a draft that deduplicated onto an earlier record (another id) adds
    none, since that record's response was kept with it."""
    return [
        response_row(draft.kept_response, created_at)
        for draft, written in zip(drafts, ids, strict=True)
        if draft.kept_response is not None and written == draft.id
    ]


def record_row(draft: RecordDraft, turn: int, created_at: datetime) -> dict[str, Any]:
    """The ``records`` row for ``draft``."""
    return {
        "id": draft.id,
        "scenario": draft.scenario,
        "session_id": draft.session_id,
        "turn": turn,
        "release_id": draft.release_id,
        "api": draft.api,
        "request_json": json_text(draft.request, "request"),
        "rendered_request_json": optional_json_text(draft.rendered_request, "rendered request"),
        "response_json": optional_json_text(draft.response, "response"),
        "status": draft.status,
        "error": draft.error,
        "latency_ms": float(draft.latency_ms),
        "usage_json": optional_json_text(draft.usage, "usage"),
        "cost": draft.cost,
        "price_json": optional_json_text(draft.price, "price"),
        "weights_digest": draft.weights_digest,
        "prompt_hash": draft.prompt_hash,
        "content_hash": draft.content_hash,
        "continuation_hash": draft.continuation_hash,
        "tags_json": json_text(draft.tags, "tags"),
        "principal": draft.principal,
        "purpose": draft.purpose,
        "idempotency_key": draft.idempotency_key,
        "created_at": draft.created_at or created_at,
    }


# What a stream's end writes over its ``pending`` row; the rest (turn, session, request,
# created_at, ...) was fixed when the stream began.
OUTCOME_COLUMNS = (
    "response_json",
    "status",
    "error",
    "latency_ms",
    "usage_json",
    "cost",
    "price_json",
    "content_hash",
    "continuation_hash",
    "idempotency_key",
)


def finish_batched(
    batched: Mapping[str, dict[str, Any]], draft: RecordDraft, now: datetime
) -> bool:
    """Write ``draft``'s outcome over its ``pending`` row when that row is in the same
    batch, not inserted yet (``batched``: id -> row; an async writer's batch can hold a
    short stream's start and end); False when it is not there."""
    row = batched.get(draft.id)
    if row is None or row["status"] != "pending":
        return False
    outcome = record_row(draft, row["turn"], now)
    row.update({name: outcome[name] for name in OUTCOME_COLUMNS})
    return True


PENDING_SETTLED = (
    "interrupted: the gateway stopped before this stream ended (settled at the next start)"
)


def record_view(row: Mapping[Any, Any], feedback: tuple[FeedbackView, ...]) -> RecordView:
    """A ``RecordView`` from a ``records`` row and its feedback."""
    return RecordView(
        id=row["id"],
        scenario=row["scenario"],
        session_id=row["session_id"],
        turn=row["turn"],
        release_id=row["release_id"],
        api=row["api"],
        request=loads(row["request_json"]),
        rendered_request=from_json_text(row["rendered_request_json"]),
        response=from_json_text(row["response_json"]),
        status=cast(RecordStatus, row["status"]),
        error=row["error"],
        latency_ms=row["latency_ms"],
        usage=from_json_text(row["usage_json"]),
        cost=row["cost"],
        price=from_json_text(row["price_json"]),
        weights_digest=row["weights_digest"],
        prompt_hash=row["prompt_hash"],
        content_hash=row["content_hash"],
        tags=loads(row["tags_json"]),
        principal=row["principal"],
        purpose=cast(Purpose, row["purpose"]),
        created_at=row["created_at"],
        feedback=feedback,
        continuation_hash=row["continuation_hash"],
        idempotency_key=row["idempotency_key"],
    )


def validated_score(score: float | None) -> float | None:
    """``score`` as a float; ``InvalidInputError`` unless it is a finite number."""
    if score is None:
        return None
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise InvalidInputError(f"score must be a number, got {type(score).__name__}")
    if not math.isfinite(score):
        raise InvalidInputError(f"score must be finite, got {score!r}")
    return float(score)


def feedback_body_hash(draft: FeedbackDraft, score: float | None) -> str:
    """Digest of what an idempotent retry must repeat exactly.

    Record ids are sorted: naming the same records in another order is the same feedback.
    """
    body = {
        "score": score,
        "feedback": draft.feedback,
        "correction": draft.correction,
        "metadata": draft.metadata or {},
        "record_ids": sorted(set(draft.record_ids)),
    }
    if draft.session_id is not None:  # absent otherwise: older rows keep their digests
        body["session_id"] = draft.session_id
    if draft.source != EXPLICIT:  # likewise
        body["source"], body["confidence"] = draft.source, draft.confidence
    try:
        return "sha256:" + sha256_hex(canonical_json(body))
    except TypeError as error:
        raise InvalidInputError(f"feedback is not JSON-serialisable: {error}") from error


def feedback_view(row: Mapping[Any, Any], record_ids: tuple[str, ...]) -> FeedbackView:
    """A ``FeedbackView`` from a ``feedback`` row and the ids it refers to."""
    return FeedbackView(
        id=row["id"],
        scenario=row["scenario"],
        record_ids=record_ids,
        score=row["score"],
        feedback=from_json_text(row["feedback_json"]),
        correction=from_json_text(row["correction_json"]),
        metadata=loads(row["metadata_json"]),
        principal=row["principal"],
        idempotency_key=row["idempotency_key"],
        created_at=row["created_at"],
        trust=row["trust"],
        quarantine_reason=row["quarantine_reason"],
        quarantined_at=row["quarantined_at"],
        released_at=row["released_at"],
        released_by=row["released_by"],
        session_id=row["session_id"],
        source=row["source"],
        confidence=row["confidence"],
    )


def encode_cursor(created_at: datetime, record_id: str) -> str:
    """An opaque cursor pointing just past ``(created_at, record_id)``."""
    raw = dumps([created_at.isoformat(), record_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Inverse of ``encode_cursor``; ``InvalidInputError`` for anything it did not make."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, record_id = loads(raw)
        when = datetime.fromisoformat(created_at)
    except (binascii.Error, ValueError, TypeError) as error:
        raise InvalidInputError(f"invalid cursor {cursor!r}") from error
    if not isinstance(record_id, str) or when.tzinfo is None:
        raise InvalidInputError(f"invalid cursor {cursor!r}")
    return when, record_id

"""Export a scenario's records, with their feedback, as JSON Lines (``jsonl``, also
named ``reef``: what ``reef import --format reef`` reads back), Parquet, OpenAI
or fine-tuning lines (``openai-finetune``: one conversation per answer, corrections
applied). OTLP/JSON GenAI spans (``reef export --format otel``) are telemetry's:
``reef.telemetry.otlp_json.export_otel`` reads the same redacted views
(``export_views``), as telemetry imports experience and not the other way round.

JSON Lines keeps requests and responses as nested objects. Parquet has a fixed schema,
so the free-form JSON values (request, response, usage, feedback bodies) are JSON text
in ``*_json`` columns; ``tags`` is a map and ``feedback`` a list of structs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from typing import IO, Any, Literal

from reef.core import dumps
from reef.core.errors import InvalidInputError, MissingExtraError, optional_dependency
from reef.experience.corrections import canonical_correction, is_tool_call_correction
from reef.experience.exchanges import TRAINABLE_APIS, canonical_exchange, chat_messages
from reef.experience.records import FeedbackView, RecordView
from reef.experience.redaction import Redactor
from reef.experience.store import ExperienceStore
from reef.upstream.canonical import openai_chat_messages

ExportFormat = Literal["jsonl", "reef", "parquet", "openai-finetune"]
EXPORT_FORMATS: tuple[str, ...] = ("jsonl", "reef", "parquet", "openai-finetune")
PARQUET_BATCH = 1000


class ParquetUnavailableError(MissingExtraError):
    """Parquet export needs pyarrow, which is not installed."""


def export_records(
    store: ExperienceStore,
    scenario: str,
    fmt: ExportFormat,
    out: str | os.PathLike[str] | IO[bytes],
    since: str | None = None,
    redactor: Redactor | None = None,
) -> int:
    """Write every record of ``scenario`` (oldest first) to ``out``; return the count.

    ``out`` is a path (created or truncated) or a binary stream (left open). With a
    ``redactor`` (``reef export`` passes the configured ``capture.redact_patterns``),
    each record and its feedback are redacted as they are written, so rows stored
    before a pattern was added leave scrubbed too. Raises ``InvalidInputError`` for an
    unknown format and ``ParquetUnavailableError`` when Parquet is asked for without
    pyarrow.
    """
    records = export_views(store, scenario, since, redactor)
    if fmt in ("jsonl", "reef"):  # ``reef``: the format ``reef import`` reads back
        outcomes = session_outcomes(store, scenario, redactor)
        with binary_output(out) as stream:
            return _write_jsonl(records, stream, outcomes)
    if fmt == "openai-finetune":
        with binary_output(out) as stream:
            return _write_finetune(records, stream)
    if fmt == "parquet":
        pa = _pyarrow()
        with binary_output(out) as stream:
            return _write_parquet(pa, records, stream)
    raise InvalidInputError(
        f"unknown export format {fmt!r}; use one of {', '.join(EXPORT_FORMATS)}"
    )


def export_views(
    store: ExperienceStore, scenario: str, since: str | None, redactor: Redactor | None
) -> Iterator[RecordView]:
    """The records of ``scenario`` as every export writes them: oldest first, from
    ``since`` (a record id) on, redacted by ``redactor`` when it has patterns."""
    records = store.iter_export(scenario, since)
    if redactor is not None and redactor.active:
        records = map(redactor.redact_view, records)
    return records


def feedback_dict(view: FeedbackView) -> dict[str, Any]:
    """One feedback entry as exported in JSON Lines."""
    return {
        "id": view.id,
        "record_ids": list(view.record_ids),
        "score": view.score,
        "feedback": view.feedback,
        "correction": view.correction,
        "metadata": view.metadata,
        "principal": view.principal,
        "idempotency_key": view.idempotency_key,
        "created_at": view.created_at.isoformat(),
        "trust": view.trust,
        "session_id": view.session_id,
        "source": view.source,
        "confidence": view.confidence,
    }


def finetune_line(view: RecordView) -> dict[str, Any] | None:
    """One record as an OpenAI fine-tuning line (``{"messages": [...], "tools": [...]}``),
    or None when it is no answer to learn from (not ``ok``, an embeddings record).

    The conversation is the request's own messages (chat) or their chat translation;
    the last assistant message is the answer, replaced by the newest correction given
    on the record when there is one (the corrected answer is what should be learnt)."""
    if view.status != "ok" or view.response is None or view.api not in TRAINABLE_APIS:
        return None
    if view.api == "openai.chat" and isinstance(view.request.get("messages"), list):
        messages = list(view.request["messages"])
    else:
        messages = chat_messages(view)
    answer = _corrected_answer(view)
    if answer is None:
        answer = _served_answer(view)
    line: dict[str, Any] = {"messages": [*messages, answer]}
    if view.request.get("tools") is not None:
        line["tools"] = view.request["tools"]
    return line


def _served_answer(view: RecordView) -> dict[str, Any]:
    if view.api == "openai.chat":
        choices = view.response.get("choices") if view.response else None
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            if isinstance(message, dict):
                return {k: v for k, v in message.items() if v is not None}
    reply = canonical_exchange(view).reply or {"role": "assistant", "content": ""}
    return openai_chat_messages([reply])[0]


def _corrected_answer(view: RecordView) -> dict[str, Any] | None:
    corrections = [f for f in view.feedback if f.correction is not None and not f.quarantined]
    if not corrections:
        return None
    correction = max(corrections, key=lambda f: (f.created_at, f.id)).correction
    if isinstance(correction, str):
        return {"role": "assistant", "content": correction}
    if is_tool_call_correction(correction):
        return openai_chat_messages([canonical_correction(correction)])[0]
    return {"role": "assistant", "content": dumps(correction).decode()}


def _write_finetune(records: Iterator[RecordView], stream: IO[bytes]) -> int:
    count = 0
    for view in records:
        line = finetune_line(view)
        if line is not None:
            stream.write(dumps(line) + b"\n")
            count += 1
    return count


def record_dict(view: RecordView) -> dict[str, Any]:
    """One record as exported in JSON Lines."""
    return {
        "id": view.id,
        "scenario": view.scenario,
        "session_id": view.session_id,
        "turn": view.turn,
        "release_id": view.release_id,
        "api": view.api,
        "request": view.request,
        "response": view.response,
        "status": view.status,
        "error": view.error,
        "latency_ms": view.latency_ms,
        "usage": view.usage,
        "prompt_hash": view.prompt_hash,
        "content_hash": view.content_hash,
        "continuation_hash": view.continuation_hash,
        "tags": view.tags,
        "principal": view.principal,
        "purpose": view.purpose,
        "idempotency_key": view.idempotency_key,
        "created_at": view.created_at.isoformat(),
        "feedback": [feedback_dict(f) for f in view.feedback],
    }


@contextmanager
def binary_output(out: str | os.PathLike[str] | IO[bytes]) -> Iterator[IO[bytes]]:
    """``out`` as a binary stream: a path opened (created or truncated) and closed
    after, or a stream as it is (left open)."""
    if isinstance(out, str | os.PathLike):
        with open(out, "wb") as stream:
            yield stream
    else:
        yield out


def session_outcomes(
    store: ExperienceStore, scenario: str, redactor: Redactor | None
) -> dict[str, list[FeedbackView]]:
    """Session id -> the outcomes given on that session as a whole (feedback naming no
    record), redacted as the records are: what a record line of the session carries."""
    found: dict[str, list[FeedbackView]] = {}
    for view in store.session_feedback(scenario):
        session = view.session_id
        if view.record_ids or session is None:
            continue
        if redactor is not None and redactor.active:
            view = redactor.redact_feedback_view(view)
        found.setdefault(session, []).append(view)
    return found


def _write_jsonl(
    records: Iterator[RecordView],
    stream: IO[bytes],
    outcomes: dict[str, list[FeedbackView]] | None = None,
) -> int:
    """One record a line with its feedback; a session's outcomes (``outcomes``) on the
    line of the session's first record written, so ``reef import`` finds the session."""
    pending = dict(outcomes or {})
    count = 0
    for view in records:
        line = record_dict(view)
        for outcome in pending.pop(view.session_id, ()):
            line["feedback"].append(feedback_dict(outcome))
        stream.write(dumps(line) + b"\n")
        count += 1
    return count


def _pyarrow() -> Any:
    with optional_dependency("parquet", "Parquet export", ParquetUnavailableError):
        import pyarrow
        import pyarrow.parquet
    return pyarrow


def _parquet_schema(pa: Any) -> Any:
    feedback = pa.struct(
        [
            ("id", pa.string()),
            ("record_ids", pa.list_(pa.string())),
            ("score", pa.float64()),
            ("feedback_json", pa.string()),
            ("correction_json", pa.string()),
            ("metadata_json", pa.string()),
            ("principal", pa.string()),
            ("idempotency_key", pa.string()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    return pa.schema(
        [
            ("id", pa.string()),
            ("scenario", pa.string()),
            ("session_id", pa.string()),
            ("turn", pa.int64()),
            ("release_id", pa.string()),
            ("api", pa.string()),
            ("request_json", pa.string()),
            ("rendered_request_json", pa.string()),
            ("response_json", pa.string()),
            ("status", pa.string()),
            ("error", pa.string()),
            ("latency_ms", pa.float64()),
            ("usage_json", pa.string()),
            ("prompt_hash", pa.string()),
            ("content_hash", pa.string()),
            ("continuation_hash", pa.string()),
            ("tags", pa.map_(pa.string(), pa.string())),
            ("principal", pa.string()),
            ("purpose", pa.string()),
            ("idempotency_key", pa.string()),
            ("created_at", pa.timestamp("us", tz="UTC")),
            ("feedback", pa.list_(feedback)),
        ]
    )


def _json_or_none(value: Any) -> str | None:
    return None if value is None else dumps(value).decode()


def _parquet_row(view: RecordView) -> dict[str, Any]:
    return {
        "id": view.id,
        "scenario": view.scenario,
        "session_id": view.session_id,
        "turn": view.turn,
        "release_id": view.release_id,
        "api": view.api,
        "request_json": dumps(view.request).decode(),
        "rendered_request_json": _json_or_none(view.rendered_request),
        "response_json": _json_or_none(view.response),
        "status": view.status,
        "error": view.error,
        "latency_ms": view.latency_ms,
        "usage_json": _json_or_none(view.usage),
        "prompt_hash": view.prompt_hash,
        "content_hash": view.content_hash,
        "continuation_hash": view.continuation_hash,
        "tags": list(view.tags.items()),
        "principal": view.principal,
        "purpose": view.purpose,
        "idempotency_key": view.idempotency_key,
        "created_at": view.created_at,
        "feedback": [
            {
                "id": f.id,
                "record_ids": list(f.record_ids),
                "score": f.score,
                "feedback_json": _json_or_none(f.feedback),
                "correction_json": _json_or_none(f.correction),
                "metadata_json": dumps(f.metadata).decode(),
                "principal": f.principal,
                "idempotency_key": f.idempotency_key,
                "created_at": f.created_at,
            }
            for f in view.feedback
        ],
    }


def _write_parquet(pa: Any, records: Iterator[RecordView], stream: IO[bytes]) -> int:
    schema = _parquet_schema(pa)
    count = 0
    # Row groups of PARQUET_BATCH records: memory stays flat however large the export.
    with pa.parquet.ParquetWriter(stream, schema) as writer:
        while batch := list(islice(records, PARQUET_BATCH)):
            writer.write_table(pa.Table.from_pylist([_parquet_row(v) for v in batch], schema))
            count += len(batch)
        if count == 0:
            writer.write_table(schema.empty_table())
    return count

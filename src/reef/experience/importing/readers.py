"""The built-in readers: ``reef`` (Reef's own export), ``openai-chat`` (chat completion
request/response pairs, or stored ChatCompletions with their messages) and
``openai-finetune`` (fine-tuning ``{"messages": [...]}`` lines), and the registry of
every reader (``langfuse``, ``langsmith``, ``tensorzero`` in modules of their own). Field mappings:
docs/import-export.md."""

from __future__ import annotations

from typing import Any

from reef.core.jsoncodec import canonical_json, sha256_hex
from reef.core.trust import TRUST_LEVELS, Trust
from reef.experience.importing.base import (
    ImportedFeedback,
    ImportedRecord,
    ImportItem,
    ImportLineError,
    ImportReader,
    as_object,
    parse_time,
)
from reef.experience.importing.langfuse import LangfuseReader
from reef.experience.importing.langsmith import LangSmithReader
from reef.experience.importing.otel import OtelReader
from reef.experience.importing.tensorzero import TensorZeroReader

# Where a chat request or a stored completion keeps a conversation id, in order.
SESSION_KEYS = ("conversation_id", "session_id", "thread_id")
_RECORD_KEYS = {"id", "scenario", "session_id", "api", "request", "response", "feedback"}


def line_digest(line: Any) -> str:
    """A source id for a line without one: the hash of its canonical JSON."""
    return sha256_hex(canonical_json(line))[:32]


class ReefReader(ImportReader):
    """Lines of ``reef export``: records keep their ids, sessions, hashes, timestamps,
    principals and feedback (with its principal, trust and source)."""

    name = "reef"

    def sniff(self, line: Any) -> bool:
        return isinstance(line, dict) and line.keys() >= _RECORD_KEYS

    def read(self, line: Any) -> ImportItem:
        row = as_object(line, "a reef record")
        missing = sorted(k for k in _RECORD_KEYS if k not in row)
        if missing:
            raise ImportLineError(f"a reef record needs {', '.join(missing)}")
        for key in ("id", "session_id", "api", "prompt_hash", "content_hash"):
            if not isinstance(row.get(key), str):
                raise ImportLineError(f"{key} must be a string")
        record = ImportedRecord(
            source_id=row["id"],
            record_id=row["id"],
            request=as_object(row["request"], "request"),
            response=row["response"] if isinstance(row["response"], dict) else None,
            api=row["api"],
            session_key=row["session_id"],
            created_at=parse_time(row.get("created_at")),
            status=str(row.get("status") or "ok"),
            error=row.get("error"),
            latency_ms=float(row.get("latency_ms") or 0.0),
            usage=row.get("usage") if isinstance(row.get("usage"), dict) else None,
            tags={str(k): str(v) for k, v in (row.get("tags") or {}).items()},
            principal=row.get("principal"),
            purpose=str(row.get("purpose") or "serve"),
            idempotency_key=row.get("idempotency_key"),
            release_id=row.get("release_id"),
            hashes=(row["prompt_hash"], row["content_hash"], row.get("continuation_hash")),
        )
        if not isinstance(row["feedback"], list):
            raise ImportLineError("feedback must be a list")
        return ImportItem((record,), tuple(_reef_feedback(f) for f in row["feedback"]))


def _reef_feedback(value: Any) -> ImportedFeedback:
    entry = as_object(value, "a feedback entry")
    if not isinstance(entry.get("id"), str):
        raise ImportLineError("a feedback entry needs its id")
    trust = entry.get("trust", "operator")
    if trust not in TRUST_LEVELS:
        raise ImportLineError(f"feedback trust must be one of {', '.join(TRUST_LEVELS)}")
    return ImportedFeedback(
        source_id=entry["id"],
        score=entry.get("score"),
        record_ids=tuple(entry.get("record_ids") or ()),
        feedback=entry.get("feedback"),
        correction=entry.get("correction"),
        metadata=entry.get("metadata") or {},
        principal=entry.get("principal"),
        trust=trust,
        idempotency_key=entry.get("idempotency_key"),
        session_id=entry.get("session_id"),
        source=entry.get("source") or "explicit",
        confidence=entry.get("confidence"),
    )


class OpenAIChatReader(ImportReader):
    """``{"request": {...}, "response": {...}}`` pairs, or a stored ChatCompletion with
    the request's ``messages`` beside its ``choices``."""

    name = "openai-chat"

    def sniff(self, line: Any) -> bool:
        if not isinstance(line, dict):
            return False
        pair = isinstance(line.get("request"), dict) and isinstance(line.get("response"), dict)
        return pair or ("choices" in line and "messages" in line)

    def read(self, line: Any) -> ImportItem:
        row = as_object(line, "an openai-chat line")
        if "request" in row or "response" in row:
            request = as_object(row.get("request"), "request")
            response = as_object(row.get("response"), "response")
        else:
            response = {k: v for k, v in row.items() if k not in ("messages", "tools", "metadata")}
            request = {"model": row.get("model"), "messages": row.get("messages")}
            for key in ("tools", "metadata"):
                if key in row:
                    request[key] = row[key]
        if not isinstance(request.get("messages"), list) or not request["messages"]:
            raise ImportLineError("request.messages must be a non-empty list")
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ImportLineError("response.choices must hold at least one choice")
        if not isinstance(choices[0].get("message"), dict):
            raise ImportLineError("response.choices[0].message must be an object")
        source_id = response.get("id")
        usage = response.get("usage")
        record = ImportedRecord(
            source_id=source_id if isinstance(source_id, str) and source_id else line_digest(row),
            request=request,
            response=response,
            session_key=_session_key(request, row),
            created_at=parse_time(response.get("created")),
            usage=usage if isinstance(usage, dict) else None,
        )
        return ImportItem((record,))


def _session_key(*sources: dict[str, Any]) -> str | None:
    for source in sources:
        metadata = source.get("metadata")
        if isinstance(metadata, dict):
            for key in SESSION_KEYS:
                value = metadata.get(key)
                if isinstance(value, str) and value:
                    return value
    return None


class OpenAIFinetuneReader(ImportReader):
    """Fine-tuning lines: the last assistant message is the answer, the messages before
    it the request (``tools`` kept), and the answer is a demonstration: feedback with
    score 1 at the importer's trust (``--demo-trust``, default ``operator``)."""

    name = "openai-finetune"

    def sniff(self, line: Any) -> bool:
        return isinstance(line, dict) and isinstance(line.get("messages"), list)

    def read(self, line: Any) -> ImportItem:
        row = as_object(line, "an openai-finetune line")
        messages = row.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ImportLineError("messages must be a list of message objects")
        last = max(
            (i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None
        )
        if last is None:
            raise ImportLineError("no assistant message: nothing to learn from")
        if last == 0:
            raise ImportLineError("the assistant message has no prompt before it")
        source_id = line_digest(row)
        request: dict[str, Any] = {"model": "imported", "messages": messages[:last]}
        if "tools" in row:
            request["tools"] = row["tools"]
        answer = messages[last]
        response = {
            "id": f"chatcmpl-import-{source_id}",
            "object": "chat.completion",
            "model": "imported",
            "choices": [
                {
                    "index": 0,
                    "message": answer,
                    "finish_reason": "tool_calls" if answer.get("tool_calls") else "stop",
                }
            ],
        }
        record = ImportedRecord(source_id=source_id, request=request, response=response)
        demonstration = ImportedFeedback(
            source_id=f"{source_id}:demonstration",
            score=1.0,
            record_indexes=(0,),
            metadata={"demonstration": True},
        )
        return ImportItem((record,), (demonstration,))


READERS: dict[str, ImportReader] = {
    reader.name: reader
    for reader in (
        ReefReader(),
        OtelReader(),
        OpenAIChatReader(),
        OpenAIFinetuneReader(),
        LangfuseReader(),
        LangSmithReader(),
        TensorZeroReader(),
    )
}
"""Readers by format name; a new format registers here (most specific first: ``auto``
asks them in this order)."""

IMPORT_FORMATS: tuple[str, ...] = tuple(READERS)


def demo_trust(value: str) -> Trust:
    """``value`` as a trust level; ``InvalidInputError`` naming the levels otherwise."""
    if value not in TRUST_LEVELS:
        raise ImportLineError(f"--demo-trust must be one of {', '.join(TRUST_LEVELS)}")
    return value

"""The OpenTelemetry GenAI attributes of a record and of feedback, as plain data.

Follows the GenAI semantic conventions (``gen_ai.*``; span name ``{operation} {model}``,
messages in the parts format of ``gen_ai.input.messages`` / ``gen_ai.output.messages``)
plus Reef's own ``reef.*`` attributes. Nothing here imports OpenTelemetry: the values are
what its SDK accepts (str, bool, int, float, and sequences of one of them).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

from reef.core import dumps, loads
from reef.experience import FeedbackDraft, FeedbackView
from reef.upstream import canonical_reply, canonical_request

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[float] | Sequence[int]
Attributes = dict[str, AttributeValue]
Rating = FeedbackDraft | FeedbackView  # feedback being stored, or stored (``reef export``)


class Exchange(Protocol):
    """What a record's span is made of: a ``RecordDraft`` being written, a stored
    ``RecordView`` (``reef export --format otel``), or the export process's copy of a
    draft (``reef.telemetry.exporter``)."""

    @property
    def id(self) -> str: ...
    @property
    def scenario(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def api(self) -> str: ...
    @property
    def purpose(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def release_id(self) -> str | None: ...
    @property
    def request(self) -> dict[str, Any]: ...
    @property
    def response(self) -> dict[str, Any] | None: ...
    @property
    def usage(self) -> dict[str, Any] | None: ...


# A record's ``api`` -> ``gen_ai.operation.name``.
OPERATIONS = {
    "openai.chat": "chat",
    "anthropic.messages": "chat",
    "openai.responses": "chat",
    "openai.completions": "text_completion",
    "openai.embeddings": "embeddings",
}
# An upstream's ``type`` -> ``gen_ai.provider.name`` (the embedded engine is Reef's own).
PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "local": "reef"}
EVALUATION_EVENT = "gen_ai.evaluation.result"
FEEDBACK_EVALUATION = "reef.feedback"
GATE_EVALUATION = "reef.gate"
_MAX_LABEL_CHARS = 32
# The conventions have no field for a corrected answer: Reef's own event attribute.
CORRECTION_ATTRIBUTE = "reef.feedback.correction"


def trace_ids(record_id: str) -> tuple[int, int]:
    """The (trace id, span id) of ``record_id``'s span, derived from the id so that later
    feedback can point at the span without anything kept in between."""
    digest = hashlib.sha256(f"reef-record:{record_id}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1  # zero is an invalid id
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


def trace_id_bytes(record_id: str) -> bytes:
    """``trace_ids(record_id)`` as OTLP writes them: the trace id's 16 bytes, then the
    span id's 8."""
    digest = hashlib.sha256(f"reef-record:{record_id}".encode()).digest()[:24]
    if digest[:16] == bytes(16) or digest[16:] == bytes(8):  # zero is an invalid id
        trace_id, span_id = trace_ids(record_id)
        return trace_id.to_bytes(16, "big") + span_id.to_bytes(8, "big")
    return digest


def span_name(draft: Exchange) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}`` (the operation alone without a model)."""
    operation = OPERATIONS.get(draft.api, "chat")
    model = draft.request.get("model")
    return f"{operation} {model}" if isinstance(model, str) and model else operation


def record_attributes(
    draft: Exchange, provider: str, pinned_release: str | None, capture_content: bool
) -> Attributes:
    """The span attributes of ``draft`` (already redacted); the messages only with
    ``capture_content``."""
    attributes: Attributes = {
        "gen_ai.operation.name": OPERATIONS.get(draft.api, "chat"),
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,  # the name older instrumentations and backends read
        "gen_ai.conversation.id": draft.session_id,
        "reef.record.id": draft.id,
        "reef.session.id": draft.session_id,
        "reef.scenario": draft.scenario,
        "reef.api": draft.api,
        "reef.purpose": draft.purpose,
        "reef.status": draft.status,
    }
    _put(attributes, "reef.release.id", draft.release_id)
    _put(attributes, "reef.candidate.id", pinned_release)
    _put(attributes, "gen_ai.request.model", draft.request.get("model"))
    response = draft.response or {}
    _put(attributes, "gen_ai.response.model", response.get("model"))
    _put(attributes, "gen_ai.response.id", response.get("id"))
    for key, value in usage_attributes(draft.usage or {}).items():
        attributes[key] = value
    reasons = finish_reasons(response)
    if reasons:
        attributes["gen_ai.response.finish_reasons"] = reasons
    if draft.status in ("error", "aborted"):
        attributes["error.type"] = draft.status
    if capture_content:
        attributes["gen_ai.input.messages"] = dumps(input_messages(draft)).decode()
        if draft.response is not None and draft.status == "ok":
            attributes["gen_ai.output.messages"] = dumps(output_messages(draft, reasons)).decode()
    return attributes


def _put(attributes: Attributes, key: str, value: Any) -> None:
    if isinstance(value, str) and value:
        attributes[key] = value


def usage_attributes(usage: dict[str, Any]) -> dict[str, int]:
    """Token counts of any of the three dialects (``prompt_tokens`` or ``input_tokens``)."""
    found: dict[str, int] = {}
    for key, names in (
        ("gen_ai.usage.input_tokens", ("input_tokens", "prompt_tokens")),
        ("gen_ai.usage.output_tokens", ("output_tokens", "completion_tokens")),
    ):
        for name in names:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                found[key] = value
                break
    return found


def finish_reasons(response: dict[str, Any]) -> list[str]:
    """Why the model stopped, per choice (chat, completions), else the Messages
    ``stop_reason`` or the Responses ``status``."""
    choices = response.get("choices")
    if isinstance(choices, list):
        return [
            str(choice["finish_reason"])
            for choice in choices
            if isinstance(choice, dict) and choice.get("finish_reason")
        ]
    for key in ("stop_reason", "status"):
        value = response.get(key)
        if isinstance(value, str) and value:
            return [value]
    return []


def input_messages(draft: Exchange) -> list[dict[str, Any]]:
    """The request's conversation in the parts format (system prompt included)."""
    return [_parts_message(message) for message in canonical_request(draft.api, draft.request)]


def output_messages(draft: Exchange, reasons: list[str]) -> list[dict[str, Any]]:
    """The answer in the parts format: one assistant message with its finish reason."""
    if draft.response is None or draft.api == "openai.embeddings":
        return []
    reply = canonical_reply(draft.api, draft.response, draft.request)
    message = _parts_message(reply)
    message["finish_reason"] = reasons[0] if reasons else "stop"
    return [message]


def _parts_message(message: dict[str, Any]) -> dict[str, Any]:
    """A canonical message (``role``, ``content``, ``tool_calls``, ``tool_call_id``) as
    a GenAI message of parts."""
    role = message.get("role", "user")
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content}
        )
    elif isinstance(content, str) and content:
        parts.append({"type": "text", "content": content})
    for call in message.get("tool_calls") or ():
        arguments: Any = call.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = loads(arguments)
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": call.get("name"),
                "arguments": arguments,
            }
        )
    out: dict[str, Any] = {"role": role, "parts": parts}
    if role != "tool" and isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def feedback_attributes(
    feedback: Rating, feedback_id: str, capture_content: bool = False
) -> Attributes:
    """The ``gen_ai.evaluation.result`` event of one feedback item: its score as the
    value; a one-word feedback (``thumbs_down``) as the label, a longer text feedback as
    the explanation; with ``capture_content``, its correction as ``reef.feedback.correction``
    (text, or the JSON of a message), which ``reef import --format otel`` reads back."""
    attributes: Attributes = {
        "gen_ai.evaluation.name": FEEDBACK_EVALUATION,
        "reef.feedback.id": feedback_id,
        "reef.feedback.source": feedback.source,
        "reef.feedback.trust": feedback.trust,
        "reef.scenario": feedback.scenario,
    }
    if feedback.score is not None:
        attributes["gen_ai.evaluation.score.value"] = float(feedback.score)
    text = feedback.feedback
    if isinstance(text, str) and text:
        if len(text) <= _MAX_LABEL_CHARS and not any(c.isspace() for c in text):
            attributes["gen_ai.evaluation.score.label"] = text
        else:
            attributes["gen_ai.evaluation.explanation"] = text
    if feedback.session_id is not None:
        attributes["gen_ai.conversation.id"] = feedback.session_id
    correction = feedback.correction
    if capture_content and correction is not None:
        attributes[CORRECTION_ATTRIBUTE] = (
            correction if isinstance(correction, str) else dumps(correction).decode()
        )
    if feedback.record_ids:
        attributes["reef.record.ids"] = list(feedback.record_ids)
    return attributes


def gate_attributes(
    scenario: str, candidate_id: str, evaluation_id: str, verdict: str, score: float | None
) -> Attributes:
    """The ``gen_ai.evaluation.result`` event of a finished gate evaluation: its verdict
    as the label, the candidate's mean score (when known) as the value."""
    attributes: Attributes = {
        "gen_ai.evaluation.name": GATE_EVALUATION,
        "gen_ai.evaluation.score.label": verdict,
        "reef.evaluation.id": evaluation_id,
        "reef.candidate.id": candidate_id,
        "reef.scenario": scenario,
    }
    if score is not None:
        attributes["gen_ai.evaluation.score.value"] = float(score)
    return attributes

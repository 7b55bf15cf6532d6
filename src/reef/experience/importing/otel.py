"""The ``otel`` reader: OpenTelemetry spans that follow the GenAI semantic conventions.

A line is one of
- an OTLP/JSON ``ExportTraceServiceRequest`` (``resourceSpans`` → ``scopeSpans`` →
  ``spans``), as the OpenTelemetry Collector's file exporter and the OTLP/JSON exporters
  write it: attributes as ``{"key", "value": {"stringValue" | "intValue" | ...}}``, ids
  in hex, times in ``*UnixNano``;
- one span in OTLP/JSON form (``traceId``, ``spanId``, ``attributes``...);
- one span as the Python SDK's ``Span.to_json`` writes it (``context.trace_id``, flat
  ``attributes``, ISO ``start_time``), written compactly on one line.

A span with a GenAI operation (``gen_ai.operation.name``) or GenAI content becomes one
record: ``gen_ai.system_instructions`` + ``gen_ai.input.messages`` its request,
``gen_ai.output.messages`` its answer (the parts format), or, from older
instrumentations, ``gen_ai.prompt`` / ``gen_ai.completion`` events or the indexed
``gen_ai.prompt.N.role`` / ``.content`` attributes. ``gen_ai.evaluation.result`` events
become feedback: on the span that carries them when it is a record, else on the span's
parent and linked spans (Reef's live export puts feedback on a child span of its own).
The correction of a feedback row, which the conventions have no field for, is carried by
the event attribute ``reef.feedback.correction`` (text, or JSON of a message). Field
mapping: docs/import-export.md.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from datetime import UTC, datetime
from typing import Any

from reef.core.jsoncodec import dumps, loads
from reef.experience.importing.base import (
    ImportedFeedback,
    ImportedRecord,
    ImportItem,
    ImportLineError,
    ImportReader,
    as_object,
    parse_time,
)
from reef.upstream.canonical import openai_chat_messages

EVALUATION_EVENT = "gen_ai.evaluation.result"
CORRECTION_ATTRIBUTE = "reef.feedback.correction"  # as reef.telemetry.attributes writes it
# Operations that are an exchange with a model (``embeddings`` has no answer to learn from).
_OPERATIONS = {"chat", "text_completion", "generate_content"}
_EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}


def attribute_value(value: Any) -> Any:
    """The plain value of an OTLP/JSON ``AnyValue`` (``{"stringValue": "x"}`` → ``"x"``)."""
    if not isinstance(value, dict):
        return value
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        try:
            return int(value["intValue"])  # int64 is a string in OTLP/JSON
        except (TypeError, ValueError) as error:
            raise ImportLineError(f"unreadable intValue {value['intValue']!r}") from error
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [attribute_value(v) for v in (value["arrayValue"] or {}).get("values") or ()]
    if "kvlistValue" in value:
        return attributes_of((value["kvlistValue"] or {}).get("values"))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def otlp_value(value: Any) -> dict[str, Any]:
    """``value`` as an OTLP/JSON ``AnyValue`` (the inverse of ``attribute_value``)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": otlp_attributes(value)}}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [otlp_value(v) for v in value]}}
    return {"stringValue": str(value)}


def otlp_attributes(attributes: dict[str, Any]) -> list[dict[str, Any]]:
    """Attributes as OTLP/JSON writes them: a list of ``{"key", "value"}``."""
    return [{"key": key, "value": otlp_value(value)} for key, value in attributes.items()]


def attributes_of(value: Any) -> dict[str, Any]:
    """Attributes as a dict, from an OTLP/JSON list of ``{key, value}`` or a flat object."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if not isinstance(value, list):
        raise ImportLineError("attributes must be a list of {key, value} or an object")
    out: dict[str, Any] = {}
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
            raise ImportLineError("an attribute must be an object with a string key")
        out[entry["key"]] = attribute_value(entry.get("value"))
    return out


def _hex_id(value: Any, size: int, what: str) -> str:
    """A trace or span id as lower-case hex: OTLP/JSON writes hex, the protobuf JSON
    mapping base64, the SDK's ``to_json`` ``0x``-prefixed hex."""
    if not isinstance(value, str) or not value:
        raise ImportLineError(f"a span needs its {what}")
    text = value[2:] if value.startswith("0x") else value
    if len(text) == size * 2:
        with contextlib.suppress(ValueError):
            int(text, 16)
            return text.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size:
        raise ImportLineError(f"unreadable {what} {value!r}")
    return raw.hex()


def _nanos(value: Any) -> datetime | None:
    if value in (None, "", 0, "0"):
        return None
    try:
        return datetime.fromtimestamp(int(value) / 1e9, UTC)
    except (TypeError, ValueError, OverflowError) as error:
        raise ImportLineError(f"unreadable time {value!r}") from error


class _Span:
    """One span in whichever of the three JSON forms, reduced to what the reader needs."""

    def __init__(self, raw: Any) -> None:
        span = as_object(raw, "a span")
        if "context" in span:  # the SDK's to_json
            context = as_object(span["context"], "context")
            self.trace_id = _hex_id(context.get("trace_id"), 16, "trace id")
            self.span_id = _hex_id(context.get("span_id"), 8, "span id")
            parent = span.get("parent_id")
            self.parent = _hex_id(parent, 8, "parent span id") if parent else None
            self.start = parse_time(span.get("start_time"))
            self.end = parse_time(span.get("end_time"))
            links = span.get("links") or []
            self.links = [
                (
                    _hex_id(as_object(link.get("context"), "a link").get("trace_id"), 16, "id"),
                    _hex_id(link["context"].get("span_id"), 8, "link span id"),
                )
                for link in links
                if isinstance(link, dict)
            ]
            self.events = [
                (
                    str(event.get("name")),
                    attributes_of(event.get("attributes")),
                    parse_time(event.get("timestamp")),
                )
                for event in span.get("events") or []
                if isinstance(event, dict)
            ]
        else:
            self.trace_id = _hex_id(span.get("traceId"), 16, "traceId")
            self.span_id = _hex_id(span.get("spanId"), 8, "spanId")
            parent = span.get("parentSpanId")
            self.parent = _hex_id(parent, 8, "parentSpanId") if parent else None
            self.start = _nanos(span.get("startTimeUnixNano"))
            self.end = _nanos(span.get("endTimeUnixNano"))
            self.links = [
                (
                    _hex_id(link.get("traceId"), 16, "link traceId"),
                    _hex_id(link.get("spanId"), 8, "link spanId"),
                )
                for link in span.get("links") or []
                if isinstance(link, dict)
            ]
            self.events = [
                (
                    str(event.get("name")),
                    attributes_of(event.get("attributes")),
                    _nanos(event.get("timeUnixNano")),
                )
                for event in span.get("events") or []
                if isinstance(event, dict)
            ]
        self.name = str(span.get("name") or "")
        self.attributes = attributes_of(span.get("attributes"))
        for name, attrs, _ in self.events:
            # The conventions' opt-in event that carries the content instead of the span.
            if name == "gen_ai.client.inference.operation.details":
                for key, value in attrs.items():
                    self.attributes.setdefault(key, value)
        status = span.get("status")
        code = status.get("code") if isinstance(status, dict) else None
        self.error = code in (2, "STATUS_CODE_ERROR", "ERROR") or "error.type" in self.attributes
        self.source_id = self.trace_id + self.span_id

    def is_exchange(self) -> bool:
        """Whether the span is a GenAI exchange (a record), not an evaluation or other span."""
        attrs = self.attributes
        operation = attrs.get("gen_ai.operation.name")
        if operation is not None:
            return operation in _OPERATIONS
        return (
            "gen_ai.input.messages" in attrs
            or "gen_ai.prompt.0.content" in attrs
            or "gen_ai.prompt" in attrs
            or any(name in ("gen_ai.content.prompt", *_EVENT_ROLES) for name, _, _ in self.events)
        )


def spans_of(line: dict[str, Any]) -> list[Any]:
    """The raw spans of a line: all of an ``ExportTraceServiceRequest``, else the line."""
    if "resourceSpans" not in line:
        return [line]
    spans: list[Any] = []
    for resource in line.get("resourceSpans") or ():
        for scope in as_object(resource, "a resourceSpans entry").get("scopeSpans") or ():
            found = as_object(scope, "a scopeSpans entry").get("spans") or ()
            if not isinstance(found, list):
                raise ImportLineError("scopeSpans[].spans must be a list")
            spans.extend(found)
    return spans


def _json_value(value: Any, what: str) -> Any:
    """An attribute that holds JSON: a string of it (the conventions' recording) or the
    value itself (a backend that keeps structured attributes)."""
    if isinstance(value, str):
        try:
            return loads(value)
        except ValueError as error:
            raise ImportLineError(f"{what} is not JSON: {error}") from error
    return value


def canonical_messages(parts_messages: Any, what: str) -> list[dict[str, Any]]:
    """GenAI messages of parts as canonical messages (``role``, ``content``,
    ``tool_calls``, ``tool_call_id``): text parts joined, each ``tool_call_response``
    part a tool message of its own."""
    if not isinstance(parts_messages, list):
        raise ImportLineError(f"{what} must be a list of messages")
    out: list[dict[str, Any]] = []
    for raw in parts_messages:
        message = as_object(raw, f"a message of {what}")
        role = message.get("role")
        if not isinstance(role, str):
            raise ImportLineError(f"a message of {what} needs its role")
        parts = message.get("parts")
        if parts is None and "content" in message:  # an older flat message
            parts = [{"type": "text", "content": message["content"]}]
        if not isinstance(parts, list):
            raise ImportLineError(f"a message of {what} needs its parts")
        texts, calls, responses = _read_parts(parts)
        out.extend(responses)
        if texts or calls or not responses:
            turn: dict[str, Any] = {"role": role}
            if texts or not calls:
                turn["content"] = "".join(texts)
            if calls:
                turn["tool_calls"] = calls
            if isinstance(message.get("name"), str):
                turn["name"] = message["name"]
            turn["_finish"] = message.get("finish_reason")
            out.append(turn)
    return out


def _read_parts(
    parts: list[Any],
) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """The texts, tool calls and tool results (as tool messages) of a message's parts;
    parts of other types (media, reasoning) are left out."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    responses: list[dict[str, Any]] = []
    for raw in parts:
        part = as_object(raw, "a message part")
        kind = part.get("type")
        if kind == "text":
            texts.append(str(part.get("content") or ""))
        elif kind == "tool_call":
            arguments = part.get("arguments")
            if not isinstance(arguments, str):
                arguments = dumps(arguments if arguments is not None else {}).decode()
            calls.append({"id": part.get("id"), "name": part.get("name"), "arguments": arguments})
        elif kind == "tool_call_response":
            response = part.get("response")
            content = response if isinstance(response, str) else dumps(response).decode()
            responses.append({"role": "tool", "tool_call_id": part.get("id"), "content": content})
    return texts, calls, responses


def _indexed(attributes: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Older instrumentations' ``gen_ai.prompt.N.role`` / ``.content`` attributes (and
    ``.tool_calls.M.*`` of OpenLLMetry) as canonical messages."""
    out: list[dict[str, Any]] = []
    index = 0
    while f"{prefix}.{index}.role" in attributes or f"{prefix}.{index}.content" in attributes:
        base = f"{prefix}.{index}"
        turn: dict[str, Any] = {
            "role": str(attributes.get(f"{base}.role") or "user"),
            "content": str(attributes.get(f"{base}.content") or ""),
        }
        calls = []
        call = 0
        while f"{base}.tool_calls.{call}.name" in attributes:
            calls.append(
                {
                    "id": attributes.get(f"{base}.tool_calls.{call}.id"),
                    "name": attributes[f"{base}.tool_calls.{call}.name"],
                    "arguments": str(attributes.get(f"{base}.tool_calls.{call}.arguments") or "{}"),
                }
            )
            call += 1
        if calls:
            turn["tool_calls"] = calls
        if f"{base}.tool_call_id" in attributes:
            turn["tool_call_id"] = attributes[f"{base}.tool_call_id"]
        turn["_finish"] = attributes.get(f"{base}.finish_reason")
        out.append(turn)
        index += 1
    return out


def _legacy_events(span: _Span) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Messages from events: ``gen_ai.content.prompt`` / ``gen_ai.content.completion``
    (attributes ``gen_ai.prompt`` / ``gen_ai.completion``, JSON) and the per-message
    ``gen_ai.{system,user,assistant,tool}.message`` / ``gen_ai.choice`` events."""
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    for name, attrs, _ in span.events:
        if name == "gen_ai.content.prompt" and "gen_ai.prompt" in attrs:
            inputs.extend(_flat_messages(_json_value(attrs["gen_ai.prompt"], "gen_ai.prompt")))
        elif name == "gen_ai.content.completion" and "gen_ai.completion" in attrs:
            outputs.extend(
                _flat_messages(
                    _json_value(attrs["gen_ai.completion"], "gen_ai.completion"), "assistant"
                )
            )
        elif name in _EVENT_ROLES:
            body = attrs.get("content", attrs.get("event.body"))
            turn = {"role": _EVENT_ROLES[name], "content": body if isinstance(body, str) else ""}
            if isinstance(attrs.get("id"), str) and name == "gen_ai.tool.message":
                turn["tool_call_id"] = attrs["id"]
            inputs.append(turn)
        elif name == "gen_ai.choice":
            body = attrs.get("message", attrs.get("content"))
            if isinstance(body, str):
                with contextlib.suppress(ValueError):
                    body = loads(body)
            if isinstance(body, dict):
                outputs.extend(_flat_messages([body], "assistant"))
            else:
                outputs.append({"role": "assistant", "content": str(body or "")})
            outputs[-1]["_finish"] = attrs.get("finish_reason")
    return inputs, outputs


def _flat_messages(value: Any, default_role: str = "user") -> list[dict[str, Any]]:
    """Messages as older instrumentations recorded them: a list of ``{role, content}``
    (OpenAI form, parts format accepted too), or a bare string."""
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise ImportLineError("prompt / completion must be messages or text")
    out = []
    for message in value:
        message = as_object(message, "a message")
        if "parts" in message:
            out.extend(canonical_messages([message], "a message"))
            continue
        turn = {
            k: v
            for k, v in message.items()
            if k in ("role", "content", "tool_calls", "tool_call_id", "name")
        }
        turn.setdefault("role", default_role)
        out.append(turn)
    return out


def _finish(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in message.items() if k != "_finish"} for message in messages]


def _messages(span: _Span) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The span's input and output messages (canonical), from the current conventions'
    attributes, else the older indexed attributes, else the older events."""
    attrs = span.attributes
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    if "gen_ai.system_instructions" in attrs:
        value = _json_value(attrs["gen_ai.system_instructions"], "gen_ai.system_instructions")
        parts = value if isinstance(value, list) else [{"type": "text", "content": value}]
        system = [{"role": "system", "parts": parts}]
        inputs.extend(canonical_messages(system, "gen_ai.system_instructions"))
    for key, found in (("gen_ai.input.messages", inputs), ("gen_ai.output.messages", outputs)):
        if key in attrs:
            found.extend(canonical_messages(_json_value(attrs[key], key), key))
    for key, found, role in (
        ("gen_ai.prompt", inputs, "user"),
        ("gen_ai.completion", outputs, "assistant"),
    ):
        if not found:
            found.extend(_indexed(attrs, key))
        if not found and key in attrs:
            found.extend(_flat_messages(_json_value(attrs[key], key), role))
    if not inputs or not outputs:
        event_inputs, event_outputs = _legacy_events(span)
        inputs = inputs or event_inputs
        outputs = outputs or event_outputs
    if not inputs:
        raise ImportLineError(
            f"span {span.source_id} has no input messages (gen_ai.input.messages, "
            "gen_ai.prompt.N.* or gen_ai.prompt events); was content capture on?"
        )
    return inputs, outputs


def _response(
    span: _Span, answer: dict[str, Any], model: str, usage: dict[str, Any]
) -> dict[str, Any]:
    """The ``chat.completion`` of the span's first output message."""
    attrs = span.attributes
    reasons = attrs.get("gen_ai.response.finish_reasons")
    finish = answer.get("_finish") or (
        reasons[0] if isinstance(reasons, list) and reasons else None
    )
    message = openai_chat_messages(_finish([answer]))[0]
    message["role"] = "assistant"
    response: dict[str, Any] = {
        "id": str(attrs.get("gen_ai.response.id") or f"chatcmpl-otel-{span.source_id}"),
        "object": "chat.completion",
        "model": str(attrs.get("gen_ai.response.model") or model),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish or ("tool_calls" if message.get("tool_calls") else "stop"),
            }
        ],
    }
    if usage:
        response["usage"] = usage
    return response


def _usage(attrs: dict[str, Any]) -> dict[str, Any]:
    """Token counts in the chat completions' names (current and older attribute names)."""
    usage: dict[str, Any] = {}
    for name, key in (
        ("gen_ai.usage.input_tokens", "prompt_tokens"),
        ("gen_ai.usage.prompt_tokens", "prompt_tokens"),
        ("gen_ai.usage.output_tokens", "completion_tokens"),
        ("gen_ai.usage.completion_tokens", "completion_tokens"),
    ):
        value = attrs.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and key not in usage:
            usage[key] = value
    if len(usage) == 2:
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


class OtelReader(ImportReader):
    """OTLP/JSON spans with GenAI attributes (module doc)."""

    name = "otel"

    def sniff(self, line: Any) -> bool:
        if not isinstance(line, dict):
            return False
        if isinstance(line.get("resourceSpans"), list):
            return True
        return ("traceId" in line and "spanId" in line) or (
            isinstance(line.get("context"), dict) and "trace_id" in line["context"]
        )

    def read(self, line: Any) -> ImportItem:
        """The records and feedback of a line's spans. A span that cannot be read is a
        problem of the line (reported with its number), not a reason to drop the other
        spans of the same export request; spans that are no GenAI exchange and carry no
        evaluation (HTTP, database spans) add nothing."""
        row = as_object(line, "an OTLP/JSON line")
        problems: list[str] = []
        spans: list[_Span] = []
        for raw in spans_of(row):
            try:
                spans.append(_Span(raw))
            except ImportLineError as error:
                problems.append(str(error))
        records: list[ImportedRecord] = []
        index: dict[str, int] = {}  # span id -> record index
        failed: set[str] = set()
        for span in spans:
            if span.is_exchange():
                try:
                    records.append(self._record(span))
                except ImportLineError as error:
                    problems.append(str(error))
                    failed.add(span.span_id)
                    continue
                index[span.span_id] = len(records) - 1
        feedback: list[ImportedFeedback] = []
        for span in spans:
            if span.span_id in failed:
                continue  # its evaluations were of the exchange that could not be read
            for entry in self._evaluations(span, index, problems):
                feedback.append(entry)
        return ImportItem(tuple(records), tuple(feedback), tuple(problems))

    def _evaluations(
        self, span: _Span, index: dict[str, int], problems: list[str]
    ) -> list[ImportedFeedback]:
        """The feedback of the span's evaluation events: on its own record when it is
        an exchange, else on its parent's and linked spans' records."""
        targets: list[tuple[str, str]] = (
            [(span.trace_id, span.span_id)] if span.span_id in index else []
        )
        if not targets:
            if span.parent is not None:
                targets.append((span.trace_id, span.parent))
            targets.extend(link for link in span.links if link not in targets)
        found: list[ImportedFeedback] = []
        for number, (name, attrs, _) in enumerate(span.events):
            if name != EVALUATION_EVENT:
                continue
            if not targets:
                problems.append(f"span {span.source_id}: an evaluation event rates no span")
                continue
            try:
                found.append(self._feedback(span, number, attrs, targets, index))
            except ImportLineError as error:
                problems.append(f"span {span.source_id}: {error}")
        return found

    def _record(self, span: _Span) -> ImportedRecord:
        attrs = span.attributes
        inputs, outputs = _messages(span)
        model = str(
            attrs.get("gen_ai.request.model") or attrs.get("gen_ai.response.model") or "imported"
        )
        request: dict[str, Any] = {
            "model": model,
            "messages": openai_chat_messages(_finish(inputs)),
        }
        usage = _usage(attrs)
        response: dict[str, Any] | None = None
        status = "error" if span.error else "ok"
        if outputs:
            response = _response(span, outputs[0], model, usage)
            status = "ok"
        elif not span.error:
            raise ImportLineError(f"span {span.source_id} has no output messages")
        latency = 0.0
        if span.start is not None and span.end is not None:
            latency = max(0.0, (span.end - span.start).total_seconds() * 1000.0)
        session = attrs.get("gen_ai.conversation.id") or attrs.get("session.id")
        return ImportedRecord(
            source_id=span.source_id,
            request=request,
            response=response,
            session_key=str(session) if session else None,
            created_at=span.start,
            status=status,
            error=str(attrs.get("error.type")) if status == "error" else None,
            latency_ms=latency,
            usage=usage or None,
        )

    def _feedback(
        self,
        span: _Span,
        number: int,
        attrs: dict[str, Any],
        targets: list[tuple[str, str]],
        index: dict[str, int],
    ) -> ImportedFeedback:
        score = attrs.get("gen_ai.evaluation.score.value")
        if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
            raise ImportLineError("gen_ai.evaluation.score.value must be a number")
        label = attrs.get("gen_ai.evaluation.score.label")
        explanation = attrs.get("gen_ai.evaluation.explanation")
        correction = attrs.get(CORRECTION_ATTRIBUTE)
        if isinstance(correction, str) and correction.startswith("{"):
            with contextlib.suppress(ValueError):
                correction = loads(correction)
        metadata: dict[str, Any] = {
            "evaluation": attrs.get("gen_ai.evaluation.name"),
        }
        if label is not None and explanation is not None:
            metadata["explanation"] = explanation
        metadata = {k: v for k, v in metadata.items() if v is not None}
        local = [index[span_id] for _, span_id in targets if span_id in index]
        common: dict[str, Any] = {
            "source_id": f"{span.source_id}:{number}",
            "score": float(score) if score is not None else None,
            "feedback": label if label is not None else explanation,
            "correction": correction,
            "metadata": metadata,
        }
        if len(local) == len(targets):
            return ImportedFeedback(record_indexes=tuple(local), **common)
        return ImportedFeedback(record_sources=tuple(t + s for t, s in targets), **common)

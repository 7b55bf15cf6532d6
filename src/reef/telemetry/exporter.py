"""The export process: encodes span descriptions read on stdin as OTLP protobuf and
sends them with the OpenTelemetry SDK's OTLP exporters (``python -m reef.telemetry.exporter``).

The gateway does not run the SDK itself: building an SDK span and encoding it as
protobuf cost about 100 µs of CPU per request (measured at concurrency 32, where a
request costs the gateway 200-300 µs in all), and a thread of the gateway would take
that from requests under the GIL. Nor does this process build SDK spans: the gateway
already batches, so SDK ``Span`` objects, the batch span processor and the SDK's
encoder would only cost CPU beside the gateway (about 240 µs a span on two loaded
cores). Each batch is encoded by ``reef.telemetry.otlp_proto`` and handed, as bytes, to
the SDK's OTLP exporter (HTTP/protobuf or gRPC), which sends it with its retries,
headers, timeout and compression. A record's span is encoded straight from the fields
the gateway sent (``encode_record``), not through a dict of attributes and a span
description (``describe``, which stays the reference its bytes are tested against),
in one join of parts kept from span to span (``_template``) and the span's own values:
parsing and encoding a span take 44,000 instructions, from 251,000 through the
description (``bench/otel_export_cpu.py``).

Protocol: the first stdin line is the ``OtelConfig`` as JSON (secrets included, so they
never show in the process list); each further line is a JSON list of spans: a record as
the compact list ``reef.telemetry.live`` writes (``RECORD_FIELDS``), whose attributes
are built here, or a span description (a dict, feedback and gate results). After each
export this process prints its counters as one JSON line on stdout (``exported_spans``,
``failed_exports``, ``failed_spans``). At the end of stdin it exits.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.sdk.resources import Resource

from reef.config import OtelConfig
from reef.core import dumps, loads
from reef.telemetry import otlp_proto
from reef.telemetry.attributes import (
    OPERATIONS,
    input_messages,
    output_messages,
    record_attributes,
    span_name,
    trace_id_bytes,
    trace_ids,
)

log = logging.getLogger("reef.telemetry")

_HTTP_ENDPOINT = "http://localhost:4318/v1/traces"
_GRPC_ENDPOINT = "http://localhost:4317"
# The order of a record's fields on the wire (``reef.telemetry.live.wire_record``):
# values only; the request's model and the response's model, id and finish reasons
# (``attributes.finish_reasons``), not the request and response. With
# ``capture_content`` the request and response follow (``CONTENT_FIELDS``).
RECORD_FIELDS = (
    "id",
    "session_id",
    "scenario",
    "api",
    "purpose",
    "status",
    "release_id",
    "error",
    "latency_ms",
    "usage",
    "model",
    "response_model",
    "response_id",
    "finish_reasons",
    "provider",
    "pinned_release",
    "end",
)
CONTENT_FIELDS = ("request", "response")
_FIELDS = len(RECORD_FIELDS)
# Below the gateway: ``SCHED_IDLE`` where the OS has it (this process then runs only on
# otherwise idle CPU), else the lowest ``nice``. Under CPU contention requests go first;
# the backlog waits in the pipe and the gateway's bounded queue, whose drops are counted.
NICENESS = 19


class WireRecord(NamedTuple):
    """A record as the gateway hands it over, an ``attributes.Exchange``: its request
    and response those of ``CONTENT_FIELDS``, else rebuilt from the fields it sent
    (``exchange``)."""

    id: str
    session_id: str
    scenario: str
    api: str
    purpose: str
    status: str
    release_id: str | None
    error: str | None
    latency_ms: float
    usage: dict[str, Any] | None
    model: Any
    response_model: Any
    response_id: Any
    finish_reasons: list[Any]
    provider: str
    pinned_release: str | None
    end: int
    request: dict[str, Any]
    response: dict[str, Any] | None


def exchange(item: Sequence[Any]) -> WireRecord:
    """``item`` (``RECORD_FIELDS``, then maybe ``CONTENT_FIELDS``) as an exchange whose
    attributes are those of the record it was made of: without content, a request of
    its model and a response of its model, id and finish reasons."""
    if len(item) == _FIELDS + len(CONTENT_FIELDS):
        return WireRecord._make(item)
    fields = WireRecord._make([*item, {}, None])
    response = {
        "model": fields.response_model,
        "id": fields.response_id,
        "choices": [{"finish_reason": reason} for reason in fields.finish_reasons],
    }
    return fields._replace(request={"model": fields.model}, response=response)


def describe(item: Any, capture_content: bool) -> dict[str, Any]:
    """The span description of one item of a batch: a record's (its attributes built
    here, as ``reef.telemetry.attributes`` builds them) or the description itself."""
    if isinstance(item, dict):
        return item
    record = exchange(item)
    trace_id, span_id = trace_ids(record.id)
    failed = record.status in ("error", "aborted")
    return {
        "name": span_name(record),
        "kind": "client",
        "ids": [f"{trace_id:032x}", f"{span_id:016x}"],
        "start": record.end - int(record.latency_ms * 1_000_000),
        "end": record.end,
        "attributes": record_attributes(
            record, record.provider, record.pinned_release, capture_content
        ),
        "error": (record.error or record.status) if failed else None,
    }


class _Unusual(Exception):
    """A record ``encode_record`` leaves to the general path (``describe``)."""


# The encoded parts of a record's span that repeat from span to span, by the values
# they are made of (``_template``): all but its ids, times, usage, response id and an
# error's message. Bounded: full, it starts afresh.
_TEMPLATES: dict[tuple[Any, ...], tuple[bytes, bytes, bytes, bytes, bool]] = {}
_MAX_KEPT = 4096
# What a str attribute writes before the value, by the value's length (``text_heads``).
_CONVERSATION = otlp_proto.text_heads("gen_ai.conversation.id")
_RECORD = otlp_proto.text_heads("reef.record.id")
_SESSION = otlp_proto.text_heads("reef.session.id")
_RESPONSE_ID = otlp_proto.text_heads("gen_ai.response.id")
_IDS_FIT = min(len(_CONVERSATION), len(_RECORD), len(_SESSION))
# Token counts' encoded attributes, kept by value below _TOKENS_KEPT.
_TOKENS_KEPT = 1 << 14
_INPUT_TOKENS: list[bytes | None] = [None] * _TOKENS_KEPT
_OUTPUT_TOKENS: list[bytes | None] = [None] * _TOKENS_KEPT
_TIMES = struct.Struct("<BQBQ")  # the start time's tag and value, the end time's
# ``attributes.trace_ids``' hash with its prefix taken in.
_TRACE_HASH = hashlib.sha256(b"reef-record:")
_ZERO = bytes(16)
_ZERO8 = bytes(8)
_STATUS_OK = otlp_proto.STATUS_UNSET + otlp_proto.LOCAL_PARENT


def _optional(value: Any) -> str | None:
    """What ``attributes._put`` keeps: a non-empty str."""
    return value if isinstance(value, str) and value else None


def _template(key: tuple[Any, ...]) -> tuple[bytes, bytes, bytes, bytes, bool]:
    """The parts of a record's span that ``key`` decides (``encode_record``): its name
    and kind; the attributes before the ids (operation, provider); those after them
    (``reef.scenario`` to ``gen_ai.response.model``); the finish reasons and
    ``error.type``; whether it failed. Kept when every value in ``key`` is a str or
    None (a str equals no value of another type, where 1, 1.0 and True are equal and
    encode differently)."""
    api, provider, scenario, purpose, status, release_id, pinned_release, model = key[:8]
    response_model = key[8]
    reasons = _reasons(key[9:])
    operation = OPERATIONS.get(api, "chat")
    name = f"{operation} {model}" if isinstance(model, str) and model else operation
    head = otlp_proto.key_values(
        9,
        {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,
        },
    )
    attributes = {
        "reef.scenario": scenario,
        "reef.api": api,
        "reef.purpose": purpose,
        "reef.status": status,
    }
    for field, value in (
        ("reef.release.id", release_id),
        ("reef.candidate.id", pinned_release),
        ("gen_ai.request.model", model),
        ("gen_ai.response.model", response_model),
    ):
        if _optional(value) is not None:
            attributes[field] = value
    tail: dict[str, Any] = {}
    if reasons:
        tail["gen_ai.response.finish_reasons"] = reasons
    failed = status in ("error", "aborted")
    if failed:
        tail["error.type"] = status
    encoded = (
        otlp_proto.name_field(name) + b"\x30\x03",  # kind CLIENT
        head,
        otlp_proto.key_values(9, attributes),
        otlp_proto.key_values(9, tail),
        failed,
    )
    if all(value is None or type(value) is str for value in key):
        if len(_TEMPLATES) >= _MAX_KEPT:
            _TEMPLATES.clear()
        _TEMPLATES[key] = encoded
    return encoded


def _reasons(reasons: Sequence[Any]) -> list[str]:
    """What ``attributes.finish_reasons`` reads of choices of these finish reasons."""
    return [str(reason) for reason in reasons if reason]


def _tokens(kept: list[bytes | None], key: str, value: int) -> bytes:
    encoded = otlp_proto.int_attribute(key, value)
    if 0 <= value < _TOKENS_KEPT:
        kept[value] = encoded
    return encoded


def encode_record(item: Sequence[Any], capture_content: bool) -> bytes:
    """The ``Span`` of a record as the gateway wrote it (``RECORD_FIELDS``): the bytes
    ``otlp_proto.span(describe(item, ...))`` writes, encoded straight from its fields
    in one join, without the attributes' dict or the description: what repeats from
    span to span is encoded once (``_template``), the ids' attributes are a kept head
    and the value (``otlp_proto.text_heads``). A record of unusual values (not str
    where a str is expected) goes the general way. ``tests/telemetry/test_exporter_encoding.py``
    compares the bytes over every dialect and status; ``bench/otel_export_cpu.py``
    measures the difference."""
    try:
        return _encode_record(item, capture_content)
    except (_Unusual, TypeError):
        return otlp_proto.span(describe(item, capture_content))


def _encode_record(item: Sequence[Any], capture_content: bool) -> bytes:
    (
        record_id,
        session_id,
        scenario,
        api,
        purpose,
        status,
        release_id,
        error,
        latency_ms,
        usage,
        model,
        response_model,
        response_id,
        reasons,
        provider,
        pinned_release,
        end,
    ) = item if len(item) == _FIELDS else item[:_FIELDS]
    if type(record_id) is not str or type(session_id) is not str or type(reasons) is not list:
        raise _Unusual
    key = (
        api,
        provider,
        scenario,
        purpose,
        status,
        release_id,
        pinned_release,
        model,
        response_model,
        *reasons,
    )
    named, head, state, tail, failed = _TEMPLATES.get(key) or _template(key)
    hashing = _TRACE_HASH.copy()  # a third of a new hash's cost (an OpenSSL context)
    hashing.update(record_id.encode())
    digest = hashing.digest()
    if digest.startswith(_ZERO) or digest.startswith(_ZERO8, 16):  # zero is invalid
        digest = trace_id_bytes(record_id)
    parts = [
        b"\x0a\x10",
        digest[:16],
        b"\x12\x08",
        digest[16:24],
        named,
        _TIMES.pack(0x39, end - int(latency_ms * 1_000_000), 0x41, end),
        head,
        _ids(session_id, record_id),
        state,
    ]
    if type(response_id) is str and response_id:
        data = response_id.encode()
        if len(data) < len(_RESPONSE_ID):
            parts += (_RESPONSE_ID[len(data)], data)
        else:
            parts.append(otlp_proto.text_attribute("gen_ai.response.id", response_id))
    if usage:
        parts.append(_usage(usage))
    parts.append(tail)
    if capture_content:
        parts.append(_content(exchange(item), _reasons(reasons)))
    if failed:
        parts += (otlp_proto.status_error(str(error or status)), otlp_proto.LOCAL_PARENT)
    else:
        parts.append(_STATUS_OK)
    return b"".join(parts)


def _ids(session_id: str, record_id: str) -> bytes:
    """The ``gen_ai.conversation.id``, ``reef.record.id`` and ``reef.session.id``
    attributes."""
    session = session_id.encode()
    record = record_id.encode()
    if len(session) < _IDS_FIT and len(record) < _IDS_FIT:
        return b"".join(
            (
                _CONVERSATION[len(session)],
                session,
                _RECORD[len(record)],
                record,
                _SESSION[len(session)],
                session,
            )
        )
    return (
        otlp_proto.text_attribute("gen_ai.conversation.id", session_id)
        + otlp_proto.text_attribute("reef.record.id", record_id)
        + otlp_proto.text_attribute("reef.session.id", session_id)
    )


def _usage(usage: Any) -> bytes:
    """The token counts' attributes (``attributes.usage_attributes``), kept by value."""
    get = usage.get
    encoded = b""
    tokens = get("input_tokens")
    if type(tokens) is not int:
        tokens = get("prompt_tokens")
    if type(tokens) is int:
        kept = _INPUT_TOKENS[tokens] if 0 <= tokens < _TOKENS_KEPT else None
        encoded = kept or _tokens(_INPUT_TOKENS, "gen_ai.usage.input_tokens", tokens)
    tokens = get("output_tokens")
    if type(tokens) is not int:
        tokens = get("completion_tokens")
    if type(tokens) is int:
        kept = _OUTPUT_TOKENS[tokens] if 0 <= tokens < _TOKENS_KEPT else None
        encoded += kept or _tokens(_OUTPUT_TOKENS, "gen_ai.usage.output_tokens", tokens)
    return encoded


def _content(record: WireRecord, reasons: list[str]) -> bytes:
    """The messages' attributes of ``record`` (``capture_content``)."""
    encoded = otlp_proto.text_attribute(
        "gen_ai.input.messages", dumps(input_messages(record)).decode()
    )
    if record.response is not None and record.status == "ok":
        output = dumps(output_messages(record, reasons)).decode()
        encoded += otlp_proto.text_attribute("gen_ai.output.messages", output)
    return encoded


@dataclass(frozen=True)
class EncodedBatch:
    """An ``ExportTraceServiceRequest`` already encoded, and how many spans it holds."""

    payload: bytes
    spans: int


class Transport:
    """The SDK's OTLP exporter of ``config.protocol``, sending encoded batches.

    The SDK's exporters take SDK spans and encode them; here the batch is encoded
    already, so the HTTP exporter's client sends the bytes, and the gRPC exporter's
    request is the bytes parsed (its ``_translate_data`` hook). Retries, headers,
    timeout and TLS stay the SDK's."""

    def __init__(self, config: OtelConfig) -> None:
        headers = {name: value.get_secret_value() for name, value in config.headers.items()}
        self.grpc = config.protocol == "grpc"
        self.exporter: Any
        if self.grpc:
            from reef.telemetry.grpc_transport import EncodedGrpcExporter

            endpoint = config.endpoint or _GRPC_ENDPOINT
            self.exporter = EncodedGrpcExporter(
                endpoint=endpoint,
                insecure=endpoint.startswith("http://"),
                headers=headers or None,
                timeout=config.timeout_seconds,
            )
        else:
            self.exporter = HttpExporter(
                endpoint=config.endpoint or _HTTP_ENDPOINT,
                headers=headers or None,
                timeout=config.timeout_seconds,
            )

    def send(self, batch: EncodedBatch) -> bool:
        """Send ``batch``; False when the collector did not take it. Never raises."""
        try:
            if self.grpc:
                return bool(self.exporter.export_encoded(batch.payload, batch.spans))
            return bool(self.exporter._client.export(batch.payload).success)
        except Exception as error:  # a transport that raises must not end the process
            log.warning("OTLP export of %d span(s) failed: %s", batch.spans, error)
            return False

    def shutdown(self) -> None:
        self.exporter.shutdown()


class Counter:
    """The counters reported after each export."""

    def __init__(self) -> None:
        self.counts = {"exported_spans": 0, "failed_exports": 0, "failed_spans": 0}

    def add(self, spans: int, sent: bool) -> dict[str, int]:
        if sent:
            self.counts["exported_spans"] += spans
        else:
            self.counts["failed_exports"] += 1
            self.counts["failed_spans"] += spans
        return dict(self.counts)


def encode(
    items: Sequence[Any], config: OtelConfig, resource: dict[str, Any]
) -> tuple[list[EncodedBatch], int]:
    """``items`` as export requests of at most ``max_export_batch_size`` spans, and the
    number of items that could not be encoded (logged)."""
    return encode_batches(items, config, otlp_proto.request_head(resource, "reef"))


def encode_batches(
    items: Sequence[Any], config: OtelConfig, head: tuple[bytes, bytes]
) -> tuple[list[EncodedBatch], int]:
    """``encode``, the resource and scope encoded already (``otlp_proto.request_head``)."""
    spans: list[bytes] = []
    broken = 0
    capture_content = config.capture_content
    for item in items:
        try:
            if isinstance(item, dict):
                spans.append(otlp_proto.span(item))
            else:
                spans.append(encode_record(item, capture_content))
        except Exception:
            log.exception("a span could not be built; skipped")
            broken += 1
    size = config.max_export_batch_size
    if len(spans) <= size:  # the gateway's batches: one request each
        chunks = [spans] if spans else []
    else:
        chunks = [spans[start : start + size] for start in range(0, len(spans), size)]
    batches = [EncodedBatch(otlp_proto.framed_request(c, head), len(c)) for c in chunks]
    return batches, broken


def lower_priority() -> None:
    """Run below the gateway (``NICENESS``); where neither is permitted, beside it."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(NICENESS)


def main() -> None:
    """Read the config, then batches of spans, until stdin ends."""
    logging.basicConfig(level=logging.WARNING, format="reef otel exporter: %(message)s")
    config = OtelConfig.model_validate(loads(sys.stdin.buffer.readline()))
    lower_priority()
    transport = Transport(config)
    resource = dict(Resource.create({"service.name": config.service_name}).attributes)
    head = otlp_proto.request_head(resource, "reef")
    counter = Counter()
    for line in sys.stdin.buffer:
        batches, broken = encode_batches(loads(line), config, head)
        counts = counter.add(broken, False) if broken else None
        for batch in batches:
            counts = counter.add(batch.spans, transport.send(batch))
        if counts is not None:
            sys.stdout.buffer.write(dumps(counts) + b"\n")
            sys.stdout.buffer.flush()
    transport.shutdown()


if __name__ == "__main__":
    main()

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
description (``describe``, which stays the reference its bytes are tested against):
parsing and encoding a span take 35% of the instructions they took
(``bench/otel_export_cpu.py``).

Protocol: the first stdin line is the ``OtelConfig`` as JSON (secrets included, so they
never show in the process list); each further line is a JSON list of spans: a record as
the compact list ``reef.telemetry.live`` writes (``RECORD_FIELDS``), whose attributes
are built here, or a span description (a dict, feedback and gate results). After each
export this process prints its counters as one JSON line on stdout (``exported_spans``,
``failed_exports``, ``failed_spans``). At the end of stdin it exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
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
    finish_reasons,
    input_messages,
    output_messages,
    record_attributes,
    span_name,
    trace_id_bytes,
    trace_ids,
    usage_attributes,
)

log = logging.getLogger("reef.telemetry")

_HTTP_ENDPOINT = "http://localhost:4318/v1/traces"
_GRPC_ENDPOINT = "http://localhost:4317"
# The order of a record's fields on the wire (``reef.telemetry.live``).
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
    "request",
    "response",
    "provider",
    "pinned_release",
    "end",
)
# Below the gateway: ``SCHED_IDLE`` where the OS has it (this process then runs only on
# otherwise idle CPU), else the lowest ``nice``. Under CPU contention requests go first;
# the backlog waits in the pipe and the gateway's bounded queue, whose drops are counted.
NICENESS = 19


class WireRecord(NamedTuple):
    """A record as the gateway hands it over (an ``attributes.Exchange``): a named tuple,
    built in a sixth of a frozen dataclass's time (0.3 µs against 1.8 µs a span)."""

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
    request: dict[str, Any]
    response: dict[str, Any] | None
    provider: str
    pinned_release: str | None
    end: int


def describe(item: Any, capture_content: bool) -> dict[str, Any]:
    """The span description of one item of a batch: a record's (its attributes built
    here, as ``reef.telemetry.attributes`` builds them) or the description itself."""
    if isinstance(item, dict):
        return item
    record = WireRecord(*item)
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


# Encoded attributes that repeat from span to span, by the values they are made of: the
# operation and provider; the scenario, API, purpose, status, releases and models (with
# the span's name); finish reasons. Bounded: full, it starts afresh.
_HEADS: dict[tuple[Any, ...], bytes] = {}
_STATES: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
_REASONS: dict[tuple[str, ...], bytes] = {}
_MAX_KEPT = 4096


class _Unusual(Exception):
    """A record ``encode_record`` leaves to the general path (``describe``)."""


def _keep(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= _MAX_KEPT:
        cache.clear()
    cache[key] = value


def _optional(value: Any) -> str | None:
    """What ``attributes._put`` keeps: a non-empty str."""
    return value if isinstance(value, str) and value else None


def _head(api: Any, provider: Any) -> bytes:
    operation = OPERATIONS.get(api, "chat")
    encoded = otlp_proto.key_values(
        9,
        {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,
        },
    )
    # Kept only for str values: a str equals no other type's value, where an int and a
    # bool can be equal and encode differently.
    if type(api) is str and type(provider) is str:
        _keep(_HEADS, (api, provider), encoded)
    return encoded


def _state(key: tuple[Any, ...]) -> tuple[bytes, bytes]:
    """The span's name (field 5) and the attributes from ``reef.scenario`` to
    ``gen_ai.response.model``."""
    scenario, api, purpose, status, release_id, pinned_release, model, response_model = key
    attributes = {
        "reef.scenario": scenario,
        "reef.api": api,
        "reef.purpose": purpose,
        "reef.status": status,
    }
    for name, value in (
        ("reef.release.id", release_id),
        ("reef.candidate.id", pinned_release),
        ("gen_ai.request.model", model),
        ("gen_ai.response.model", response_model),
    ):
        if _optional(value) is not None:
            attributes[name] = value
    operation = OPERATIONS.get(api, "chat")
    name = f"{operation} {model}" if isinstance(model, str) and model else operation
    encoded = otlp_proto.name_field(name), otlp_proto.key_values(9, attributes)
    if all(type(value) is str for value in key[:4]):  # as in ``_head``
        _keep(_STATES, key, encoded)
    return encoded


def _reasons(reasons: list[str]) -> bytes:
    key = tuple(reasons)
    encoded = _REASONS.get(key)
    if encoded is None:
        encoded = otlp_proto.key_values(9, {"gen_ai.response.finish_reasons": reasons})
        _keep(_REASONS, key, encoded)
    return encoded


def encode_record(item: Sequence[Any], capture_content: bool) -> bytes:
    """The ``Span`` of a record as the gateway wrote it (``RECORD_FIELDS``): the bytes
    ``otlp_proto.span(describe(item, ...))`` writes, encoded straight from its fields,
    without the attributes' dict or the description, the attributes that repeat encoded
    once (``_HEADS``, ``_STATES``, ``_REASONS``). A record of unusual values (not str
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
        request,
        response,
        provider,
        pinned_release,
        end,
    ) = item
    if type(session_id) is not str or type(record_id) is not str:
        raise _Unusual
    model = request.get("model")
    answer = response or {}
    head = _HEADS.get((api, provider)) or _head(api, provider)
    key = (scenario, api, purpose, status, release_id, pinned_release, model, answer.get("model"))
    name, state = _STATES.get(key) or _state(key)
    parts = [head, otlp_proto.conversation_ids(session_id, record_id), state]
    response_id = answer.get("id")
    if isinstance(response_id, str) and response_id:
        parts.append(otlp_proto.text_attribute("gen_ai.response.id", response_id))
    if usage:
        tokens = usage_attributes(usage)
        if tokens:
            parts.append(otlp_proto.key_values(9, tokens))
    reasons = finish_reasons(answer)
    if reasons:
        parts.append(_REASONS.get(tuple(reasons)) or _reasons(reasons))
    failed = status in ("error", "aborted")
    if failed:
        parts.append(otlp_proto.key_values(9, {"error.type": status}))
    if capture_content:
        record = WireRecord(*item)
        parts.append(
            otlp_proto.text_attribute(
                "gen_ai.input.messages", dumps(input_messages(record)).decode()
            )
        )
        if response is not None and status == "ok":
            output = dumps(output_messages(record, reasons)).decode()
            parts.append(otlp_proto.text_attribute("gen_ai.output.messages", output))
    return otlp_proto.record_span(
        trace_id_bytes(record_id),
        name,
        end - int(latency_ms * 1_000_000),
        end,
        b"".join(parts),
        str(error or status) if failed else None,
    )


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
    spans: list[bytes] = []
    broken = 0
    for item in items:
        try:
            if isinstance(item, dict):
                spans.append(otlp_proto.span(item))
            else:
                spans.append(encode_record(item, config.capture_content))
        except Exception:
            log.exception("a span could not be built; skipped")
            broken += 1
    size = config.max_export_batch_size
    batches = [
        EncodedBatch(
            otlp_proto.export_request(spans[start : start + size], resource, "reef"),
            len(spans[start : start + size]),
        )
        for start in range(0, len(spans), size)
    ]
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
    counter = Counter()
    for line in sys.stdin.buffer:
        batches, broken = encode(loads(line), config, resource)
        counts = counter.add(broken, False) if broken else None
        for batch in batches:
            counts = counter.add(batch.spans, transport.send(batch))
        if counts is not None:
            sys.stdout.buffer.write(dumps(counts) + b"\n")
            sys.stdout.buffer.flush()
    transport.shutdown()


if __name__ == "__main__":
    main()

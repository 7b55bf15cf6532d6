"""The export process: builds OpenTelemetry SDK spans from span descriptions read on
stdin and sends them over OTLP (``python -m reef.telemetry.exporter``).

The gateway does not run the SDK itself: building an SDK span and encoding it as
protobuf cost about 100 µs of CPU per request (measured at concurrency 32, where a
request costs the gateway 200-300 µs in all), and a thread of the gateway would take
that from requests under the GIL. This process does it beside the gateway instead.

Protocol: the first stdin line is the ``OtelConfig`` as JSON (secrets included, so they
never show in the process list); each further line is a JSON list of span descriptions
(``reef.telemetry.live``). After each export this process prints its counters as one
JSON line on stdout (``exported_spans``, ``failed_exports``, ``failed_spans``). At the end
of stdin it exports what is queued and exits.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from reef.config import OtelConfig
from reef.core import dumps, loads

log = logging.getLogger("reef.telemetry")

_HTTP_ENDPOINT = "http://localhost:4318/v1/traces"
_GRPC_ENDPOINT = "http://localhost:4317"
_KINDS = {"client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
# The ids the next span started on this thread takes (a record's derived ids).
_next_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "reef_otel_next_ids", default=None
)


class _GivenIds(IdGenerator):
    """Random ids, except for a span whose description names its own."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        ids = _next_ids.get()
        return ids[1] if ids is not None else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        ids = _next_ids.get()
        return ids[0] if ids is not None else self._random.generate_trace_id()


class CountingExporter(SpanExporter):
    """Counts what ``inner`` exported and failed to; tells ``report`` after each export;
    never raises."""

    def __init__(self, inner: SpanExporter, report: Callable[[dict[str, int]], None]) -> None:
        self.inner = inner
        self.report = report
        self._lock = threading.Lock()
        self.counts = {"exported_spans": 0, "failed_exports": 0, "failed_spans": 0}

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as error:  # an exporter that raises must not kill the batch thread
            log.warning("OTLP export of %d span(s) failed: %s", len(spans), error)
            result = SpanExportResult.FAILURE
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.counts["exported_spans"] += len(spans)
            else:
                self.counts["failed_exports"] += 1
                self.counts["failed_spans"] += len(spans)
            counts = dict(self.counts)
        self.report(counts)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def otlp_exporter(config: OtelConfig) -> SpanExporter:
    """The OTLP span exporter of ``config.protocol``, with its endpoint, headers and timeout."""
    headers = {name: value.get_secret_value() for name, value in config.headers.items()}
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        endpoint = config.endpoint or _GRPC_ENDPOINT
        return GrpcExporter(
            endpoint=endpoint,
            insecure=endpoint.startswith("http://"),
            headers=headers or None,
            timeout=config.timeout_seconds,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(
        endpoint=config.endpoint or _HTTP_ENDPOINT,
        headers=headers or None,
        timeout=config.timeout_seconds,
    )


def tracer_provider(config: OtelConfig, exporter: SpanExporter) -> TracerProvider:
    """A provider (``service.name`` from ``config``) exporting through a batch processor."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": config.service_name}),
        id_generator=_GivenIds(),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            max_queue_size=config.max_queue_size,
            max_export_batch_size=config.max_export_batch_size,
            schedule_delay_millis=config.schedule_delay_seconds * 1000.0,
            export_timeout_millis=config.timeout_seconds * 1000.0,
        )
    )
    return provider


def _context(ids: list[str]) -> SpanContext:
    return SpanContext(int(ids[0], 16), int(ids[1], 16), is_remote=True, trace_flags=TraceFlags(1))


def emit(tracer: trace.Tracer, description: dict[str, Any]) -> None:
    """Start and end the SDK span ``description`` describes (``reef.telemetry.live``)."""
    parent = description.get("parent")
    context = set_span_in_context(NonRecordingSpan(_context(parent))) if parent else None
    ids = description.get("ids")
    token = _next_ids.set((int(ids[0], 16), int(ids[1], 16)) if ids else None)
    try:
        span = tracer.start_span(
            description["name"],
            context=context,
            kind=_KINDS[description["kind"]],
            attributes=description["attributes"],
            links=[Link(_context(link)) for link in description.get("links", ())],
            start_time=description["start"],
        )
    finally:
        _next_ids.reset(token)
    for name, attributes in description.get("events", ()):
        span.add_event(name, attributes, timestamp=description["end"])
    error = description.get("error")
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=description["end"])


def main() -> None:
    """Read the config, then batches of span descriptions, until stdin ends."""
    logging.basicConfig(level=logging.WARNING, format="reef otel exporter: %(message)s")
    out_lock = threading.Lock()

    def report(counts: dict[str, int]) -> None:
        with out_lock:
            sys.stdout.buffer.write(dumps(counts) + b"\n")
            sys.stdout.buffer.flush()

    config = OtelConfig.model_validate(loads(sys.stdin.buffer.readline()))
    provider = tracer_provider(config, CountingExporter(otlp_exporter(config), report))
    tracer = provider.get_tracer("reef")
    for line in sys.stdin.buffer:
        for description in loads(line):
            try:
                emit(tracer, description)
            except Exception:
                log.exception("a span could not be built; skipped")
    provider.shutdown()


if __name__ == "__main__":
    main()

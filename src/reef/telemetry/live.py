"""The OpenTelemetry SDK pipeline of live export (imported only when ``otel.enabled``).

Spans are built on the calling thread (cheap: a dict of attributes) and handed to the
SDK's ``BatchSpanProcessor``, whose own thread exports them: a request never waits for
the collector, and a full queue drops spans instead of blocking. Every failed export is
counted (``reef_otel_export_failures_total``), so a collector that is down shows in
``/metrics`` rather than only in a log line.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Sequence

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
from reef.experience import FeedbackDraft, RecordDraft
from reef.telemetry.attributes import (
    EVALUATION_EVENT,
    feedback_attributes,
    gate_attributes,
    record_attributes,
    span_name,
    trace_ids,
)

log = logging.getLogger(__name__)

_HTTP_ENDPOINT = "http://localhost:4318/v1/traces"
_GRPC_ENDPOINT = "http://localhost:4317"
# The ids the next span started on this thread takes (a record's derived ids).
_next_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "reef_otel_next_ids", default=None
)


class _RecordIds(IdGenerator):
    """Random ids, except for a record's span, whose ids derive from the record id."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        ids = _next_ids.get()
        return ids[1] if ids is not None else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        ids = _next_ids.get()
        return ids[0] if ids is not None else self._random.generate_trace_id()


class CountingExporter(SpanExporter):
    """Counts the exports ``inner`` failed (and the spans in them); never raises."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self.failed_exports = 0
        self.failed_spans = 0
        self.exported_spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as error:  # an exporter that raises must not kill the batch thread
            log.warning("OTLP export of %d span(s) failed: %s", len(spans), error)
            result = SpanExportResult.FAILURE
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.exported_spans += len(spans)
            else:
                self.failed_exports += 1
                self.failed_spans += len(spans)
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


class LiveExport:
    """Sends records as spans and feedback as evaluation events (module doc).

    Every method returns at once and never raises: export is best effort, and a
    problem with it must not fail the request that triggered it."""

    def __init__(self, config: OtelConfig, exporter: SpanExporter | None = None) -> None:
        self.config = config
        self.exporter = CountingExporter(exporter or otlp_exporter(config))
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            id_generator=_RecordIds(),
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(
                self.exporter,
                max_queue_size=config.max_queue_size,
                max_export_batch_size=config.max_export_batch_size,
                schedule_delay_millis=config.schedule_delay_seconds * 1000.0,
                export_timeout_millis=config.timeout_seconds * 1000.0,
            )
        )
        self._tracer = self._provider.get_tracer("reef")
        self.build_failures = 0

    @property
    def failed_exports(self) -> int:
        """Exports the collector did not take (down, refused, timed out)."""
        return self.exporter.failed_exports

    def record(self, draft: RecordDraft, provider: str, pinned_release: str | None) -> None:
        """One CLIENT span for the recorded exchange ``draft``, ending now and starting
        its latency earlier; an error or aborted record sets the span's status."""
        try:
            end = time.time_ns()
            start = end - int(draft.latency_ms * 1_000_000)
            attributes = record_attributes(
                draft, provider, pinned_release, self.config.capture_content
            )
            token = _next_ids.set(trace_ids(draft.id))
            try:
                span = self._tracer.start_span(
                    span_name(draft),
                    kind=SpanKind.CLIENT,
                    attributes=attributes,
                    start_time=start,
                )
            finally:
                _next_ids.reset(token)
            if draft.status in ("error", "aborted"):
                span.set_status(Status(StatusCode.ERROR, draft.error or draft.status))
            span.end(end_time=end)
        except Exception:
            self._failed_to_build("record " + draft.id)

    def feedback(self, feedback: FeedbackDraft, feedback_id: str) -> None:
        """A ``gen_ai.evaluation.result`` event on a span of its own, a child of the
        first rated record's span and linked to every rated record's span."""
        try:
            contexts = [_record_context(record_id) for record_id in feedback.record_ids]
            parent = set_span_in_context(NonRecordingSpan(contexts[0])) if contexts else None
            span = self._tracer.start_span(
                "evaluation feedback",
                context=parent,
                kind=SpanKind.INTERNAL,
                links=[Link(context) for context in contexts],
            )
            span.add_event(EVALUATION_EVENT, feedback_attributes(feedback, feedback_id))
            span.end()
        except Exception:
            self._failed_to_build("feedback " + feedback_id)

    def gate(
        self,
        scenario: str,
        candidate_id: str,
        evaluation_id: str,
        verdict: str,
        score: float | None,
    ) -> None:
        """A finished gate evaluation as a ``gen_ai.evaluation.result`` event."""
        try:
            span = self._tracer.start_span("evaluation gate", kind=SpanKind.INTERNAL)
            span.add_event(
                EVALUATION_EVENT,
                gate_attributes(scenario, candidate_id, evaluation_id, verdict, score),
            )
            span.end()
        except Exception:
            self._failed_to_build("evaluation " + evaluation_id)

    def _failed_to_build(self, what: str) -> None:
        self.build_failures += 1
        log.exception("could not build the OTel span of %s; not exported", what)

    def flush(self, timeout_seconds: float = 30.0) -> bool:
        """Export everything queued; False when that did not finish in time."""
        return self._provider.force_flush(int(timeout_seconds * 1000))

    def shutdown(self) -> None:
        """Export what is queued (within the export timeout) and stop the export thread."""
        self._provider.shutdown()


def _record_context(record_id: str) -> SpanContext:
    trace_id, span_id = trace_ids(record_id)
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(1))

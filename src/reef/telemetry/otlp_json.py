"""``reef export --format otel``: stored records as OTLP/JSON, as the OpenTelemetry
Collector's file exporter writes it (one ``ExportTraceServiceRequest`` per line:
``resourceSpans`` → ``scopeSpans`` → ``spans``).

Each record is one CLIENT span with the attributes the live export sends
(``reef.telemetry.attributes``), starting at the record's time and lasting its latency;
each feedback item is an INTERNAL span holding one ``gen_ai.evaluation.result`` event, a
child of its first record's span and linked to every record's span, written once, on the
line of the last of its records. Ids are derived from record and feedback ids, so a
second export of the same rows writes the same ids and ``reef import --format otel``
deduplicates it. Message content (and corrections) are written only with
``capture_content``: without them the file describes traffic but cannot be imported
back (tested by ``tests/experience/test_export_otel.py``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

from reef.core import dumps
from reef.experience import (
    ExperienceStore,
    FeedbackView,
    RecordView,
    Redactor,
    binary_output,
    export_views,
    otlp_attributes,
)
from reef.telemetry.attributes import (
    EVALUATION_EVENT,
    feedback_attributes,
    record_attributes,
    span_name,
    trace_ids,
)


@dataclass(frozen=True)
class OtelFileOptions:
    """``reef export --format otel``'s options: whether spans carry message content and
    corrections (without them the file cannot be imported back), and the resource's
    ``service.name``."""

    capture_content: bool = True
    service_name: str = "reef"


def export_otel(
    store: ExperienceStore,
    scenario: str,
    out: str | os.PathLike[str] | IO[bytes],
    options: OtelFileOptions,
    since: str | None = None,
    redactor: Redactor | None = None,
) -> int:
    """Write every record of ``scenario`` (oldest first, redacted as every export is:
    ``reef.experience.export_views``) to ``out`` as OTLP/JSON GenAI spans, with
    ``options``; return the count."""
    records = export_views(store, scenario, since, redactor)
    with binary_output(out) as stream:
        return write_otlp_json(records, stream, options.capture_content, options.service_name)


SPANS_PER_LINE = 100  # records per ExportTraceServiceRequest line (with their feedback)
_CLIENT, _INTERNAL = 3, 1  # SpanKind in OTLP
_ERROR = 2  # StatusCode ERROR
# A stored record keeps no upstream; its API's provider stands in for gen_ai.provider.name.
_API_PROVIDERS = {"anthropic.messages": "anthropic"}


def _hex(record_id: str) -> tuple[str, str]:
    trace_id, span_id = trace_ids(record_id)
    return f"{trace_id:032x}", f"{span_id:016x}"


def _nanos(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000) * 1000


def record_span(view: RecordView, capture_content: bool) -> dict[str, Any]:
    """The OTLP/JSON span of one stored record."""
    trace_id, span_id = _hex(view.id)
    start = _nanos(view.created_at)
    provider = _API_PROVIDERS.get(view.api, "openai")
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": span_name(view),
        "kind": _CLIENT,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + int(view.latency_ms * 1_000_000)),
        "attributes": otlp_attributes(record_attributes(view, provider, None, capture_content)),
    }
    if view.status in ("error", "aborted"):
        span["status"] = {"code": _ERROR, "message": view.error or view.status}
    return span


def feedback_span(feedback: FeedbackView, capture_content: bool) -> dict[str, Any]:
    """The OTLP/JSON span of one feedback item: its evaluation event, a child of its
    first record's span, linked to all of them."""
    links = [_hex(record_id) for record_id in feedback.record_ids]
    digest = hashlib.sha256(f"reef-feedback:{feedback.id}".encode()).digest()
    trace_id = links[0][0] if links else digest[:16].hex()
    at = str(_nanos(feedback.created_at))
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": digest[16:24].hex(),
        "name": "evaluation feedback",
        "kind": _INTERNAL,
        "startTimeUnixNano": at,
        "endTimeUnixNano": at,
        "links": [{"traceId": t, "spanId": s} for t, s in links],
        "events": [
            {
                "timeUnixNano": at,
                "name": EVALUATION_EVENT,
                "attributes": otlp_attributes(
                    feedback_attributes(feedback, feedback.id, capture_content)
                ),
            }
        ],
    }
    if links:
        span["parentSpanId"] = links[0][1]
    return span


def export_request(spans: list[dict[str, Any]], service_name: str) -> dict[str, Any]:
    """One ``ExportTraceServiceRequest`` holding ``spans``."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": otlp_attributes({"service.name": service_name})},
                "scopeSpans": [{"scope": {"name": "reef"}, "spans": spans}],
            }
        ]
    }


def _spans(
    records: Iterable[RecordView], capture_content: bool
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Per record, 1 and its span with the spans of the feedback it completes (the
    feedback whose records have all been written); then 0 and the feedback whose records
    never came (rows exported with ``since`` after some of its records)."""
    waiting: dict[str, tuple[FeedbackView, set[str]]] = {}
    for view in records:
        spans = [record_span(view, capture_content)]
        for feedback in view.feedback:
            entry = waiting.setdefault(feedback.id, (feedback, set(feedback.record_ids)))
            entry[1].discard(view.id)
            if not entry[1]:
                del waiting[feedback.id]
                spans.append(feedback_span(feedback, capture_content))
        yield 1, spans
    if waiting:
        yield 0, [feedback_span(feedback, capture_content) for feedback, _ in waiting.values()]


def write_otlp_json(
    records: Iterable[RecordView], stream: IO[bytes], capture_content: bool, service_name: str
) -> int:
    """Write ``records`` (with their feedback) to ``stream`` as OTLP/JSON lines of
    ``SPANS_PER_LINE`` records; return the number of records."""
    count = 0
    line: list[dict[str, Any]] = []
    held = 0
    for records_in, spans in _spans(records, capture_content):
        line.extend(spans)
        held += 1
        count += records_in
        if held >= SPANS_PER_LINE:
            stream.write(dumps(export_request(line, service_name)) + b"\n")
            line, held = [], 0
    if line:
        stream.write(dumps(export_request(line, service_name)) + b"\n")
    return count

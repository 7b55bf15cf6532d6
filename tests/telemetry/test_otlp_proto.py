"""``reef.telemetry.otlp_proto`` writes the bytes the OpenTelemetry SDK's own encoder
writes for the same span (parsed with ``opentelemetry-proto`` and compared)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from reef.telemetry import otlp_proto

TRACE, SPAN, PARENT = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", "00f067aa0ba902b7"
ATTRIBUTES: dict[str, Any] = {
    "text": "héllo",
    "count": 3,
    "negative": -2,
    "big": 2**62,
    "ratio": 1.5,
    "flag": True,
    "off": False,
    "names": ["stop", "length"],
    "scores": [1.0, 2.5],
    "empty": "",
}


def _context(trace: str, span: str, remote: bool) -> SpanContext:
    return SpanContext(int(trace, 16), int(span, 16), is_remote=remote, trace_flags=TraceFlags(1))


def _sdk(description: dict[str, Any], resource: Resource) -> ExportTraceServiceRequest:
    parent = description.get("parent")
    error = description.get("error")
    span = ReadableSpan(
        name=description["name"],
        context=_context(*description["ids"], remote=False),
        parent=_context(*parent, remote=True) if parent else None,
        resource=resource,
        attributes=description["attributes"],
        events=tuple(
            Event(name, attributes, timestamp=description["end"])
            for name, attributes in description.get("events", ())
        ),
        links=tuple(Link(_context(*link, remote=True)) for link in description.get("links", ())),
        kind=SpanKind.CLIENT if description["kind"] == "client" else SpanKind.INTERNAL,
        status=Status(StatusCode.ERROR, error) if error else Status(StatusCode.UNSET),
        start_time=description["start"],
        end_time=description["end"],
        instrumentation_scope=InstrumentationScope("reef"),
    )
    encoded: ExportTraceServiceRequest = encode_spans([span])
    return encoded


@pytest.mark.parametrize(
    "description",
    [
        {
            "name": "chat reef/support",
            "kind": "client",
            "ids": [TRACE, SPAN],
            "start": 1_700_000_000_000_000_000,
            "end": 1_700_000_000_123_456_789,
            "attributes": ATTRIBUTES,
            "error": None,
        },
        {
            "name": "chat",
            "kind": "client",
            "ids": [TRACE, SPAN],
            "start": 5,
            "end": 9,
            "attributes": {"error.type": "error"},
            "error": "upstream said 500",
        },
        {
            "name": "evaluation feedback",
            "kind": "internal",
            "ids": [TRACE, SPAN],
            "parent": [TRACE, PARENT],
            "links": [[TRACE, PARENT], ["1" * 32, "2" * 16]],
            "start": 7,
            "end": 7,
            "attributes": {},
            "events": [["gen_ai.evaluation.result", {"gen_ai.evaluation.score.value": 0.5}]],
        },
    ],
)
def test_encoding_equals_the_sdks(description: dict[str, Any]) -> None:
    resource = Resource({"service.name": "reef", "telemetry.sdk.language": "python"})
    ours = ExportTraceServiceRequest.FromString(
        otlp_proto.export_request([otlp_proto.span(description)], resource.attributes, "reef")
    )
    assert ours == _sdk(description, resource)


def test_spans_without_ids_get_random_ones_and_several_spans_share_a_request() -> None:
    description = {"name": "evaluation gate", "kind": "internal", "start": 1, "end": 1}
    payload = otlp_proto.export_request(
        [otlp_proto.span({**description, "attributes": {}}) for _ in range(3)], {}, "reef"
    )
    (resource_spans,) = ExportTraceServiceRequest.FromString(payload).resource_spans
    spans = resource_spans.scope_spans[0].spans
    assert len({span.span_id for span in spans}) == 3
    assert all(len(span.trace_id) == 16 and len(span.span_id) == 8 for span in spans)


def test_an_attribute_of_another_type_is_refused() -> None:
    with pytest.raises(TypeError, match="dict"):
        otlp_proto.any_value({"nested": 1})

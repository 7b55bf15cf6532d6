"""The SDK's OTLP/gRPC span exporter, sending a batch encoded beforehand
(``reef.telemetry.otlp_proto``): its request is the bytes parsed, its retries, channel,
headers and timeout its own. Imported by the export process for ``protocol: grpc`` only
(it loads grpcio)."""

from __future__ import annotations

from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExportResult


class _Encoded:
    """What ``_export`` passes to the hooks below: the bytes and their span count."""

    def __init__(self, payload: bytes, spans: int) -> None:
        self.payload = payload
        self.spans = spans


class EncodedGrpcExporter(OTLPSpanExporter):
    """``OTLPSpanExporter`` whose data is an encoded ``ExportTraceServiceRequest``."""

    def export_encoded(self, payload: bytes, spans: int) -> bool:
        """Send ``payload`` (``spans`` spans); True when the collector took it."""
        result = self._export(_Encoded(payload, spans))  # type: ignore[arg-type]
        return bool(result is SpanExportResult.SUCCESS)

    def _translate_data(self, data: Any) -> ExportTraceServiceRequest:
        request: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(data.payload)
        return request

    def _count_data(self, data: Any) -> int:
        return int(data.spans)

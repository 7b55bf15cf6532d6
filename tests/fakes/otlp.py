"""A real OTLP/HTTP receiver on loopback: takes ``POST /v1/traces`` bodies, parses them
as ``ExportTraceServiceRequest`` with ``opentelemetry-proto``, and keeps the spans."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import (
    TraceServiceServicer,
    add_TraceServiceServicer_to_server,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.fakes.loopback import LoopbackThread


def value_of(value: AnyValue) -> Any:
    """The Python value of an OTLP ``AnyValue``."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return None if kind is None else getattr(value, kind)


def attributes_of(pairs: Any) -> dict[str, Any]:
    """OTLP ``KeyValue`` pairs as a dict."""
    items: list[KeyValue] = list(pairs)
    return {pair.key: value_of(pair.value) for pair in items}


@dataclass
class ReceivedSpan:
    """One span as the receiver parsed it."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]
    status_code: int
    status_message: str
    resource: dict[str, Any] = field(default_factory=dict)


class OtlpReceiver(LoopbackThread):
    """Collects every span exported to ``traces_url``; ``headers`` holds each request's."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[ReceivedSpan] = []
        self.headers: list[dict[str, str]] = []
        self.requests = 0
        self._lock = threading.Lock()

    @property
    def traces_url(self) -> str:
        """``http://127.0.0.1:port/v1/traces``."""
        return f"{self.base_url}/traces"

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/traces", self._traces)

    async def _traces(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415, text="OTLP/HTTP protobuf only")
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        received = list(spans_of(message))
        with self._lock:
            self.requests += 1
            self.headers.append(dict(request.headers))
            self.spans.extend(received)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def named(self, prefix: str) -> list[ReceivedSpan]:
        """The spans received so far whose name starts with ``prefix``."""
        with self._lock:
            return [span for span in self.spans if span.name.startswith(prefix)]


def spans_of(message: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Every span of an export request, with its resource's attributes."""
    spans: list[ReceivedSpan] = []
    for resource_spans in message.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        kind=span.kind,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=attributes_of(span.attributes),
                        events=[(e.name, attributes_of(e.attributes)) for e in span.events],
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        status_code=span.status.code,
                        status_message=span.status.message,
                        resource=resource,
                    )
                )
    return spans


class OtlpGrpcReceiver(TraceServiceServicer):
    """The same receiver over OTLP/gRPC (``grpc.server`` on a loopback port)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=2))
        add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:port`` (plain text, as a local collector listens)."""
        return f"http://127.0.0.1:{self.port}"

    def Export(  # the generated service names its method so
        self, request: ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> ExportTraceServiceResponse:
        received = spans_of(request)
        with self._lock:
            self.spans.extend(received)
        return ExportTraceServiceResponse()

    def __enter__(self) -> OtlpGrpcReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    """Serve the OTLP/HTTP receiver on ``--port`` until interrupted (for benchmarks);
    ``GET /healthz`` answers the number of spans received."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description="a loopback OTLP/HTTP trace receiver")
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args(argv).port

    class Served(OtlpReceiver):
        """Parses every request but only counts its spans: a collector runs beside the
        gateway in a benchmark, and should take no more CPU than it must."""

        received = 0

        def routes(self, app: web.Application) -> None:
            app.router.add_post("/v1/traces", self._count_traces)
            app.router.add_get("/healthz", self._count)

        async def _count_traces(self, request: web.Request) -> web.StreamResponse:
            message = ExportTraceServiceRequest()
            message.ParseFromString(await request.read())
            self.received += sum(
                len(scope.spans)
                for resource in message.resource_spans
                for scope in resource.scope_spans
            )
            return web.Response(
                body=ExportTraceServiceResponse().SerializeToString(),
                content_type="application/x-protobuf",
            )

        async def _count(self, request: web.Request) -> web.StreamResponse:
            return web.Response(text=str(self.received))

        async def _start(self) -> None:
            app = web.Application()
            self.routes(app)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", port).start()
            self.port = port

    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Served():
        stop.wait()


if __name__ == "__main__":
    main()

"""Live export through a real gateway to a real OTLP receiver on loopback (issue 40)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from reef.releases import ReleaseChain, ReleaseManifest
from reef.telemetry.attributes import trace_ids
from tests.fakes.otlp import OtlpGrpcReceiver, OtlpReceiver, ReceivedSpan
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, free_port, make_settings
from tests.gateway.rawhttp import call
from tests.polling import eventually

SPAN_KIND_CLIENT = 3  # opentelemetry.proto.trace.v1.Span.SpanKind
STATUS_CODE_ERROR = 2


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread() as server:
        yield server


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as server:
        yield server


@pytest.fixture
def make_gateway(
    tmp_path: Path, fake: FakeUpstreamThread
) -> Iterator[Callable[..., GatewayThread]]:
    started: list[GatewayThread] = []

    def start(endpoint: str, **otel: Any) -> GatewayThread:
        settings = make_settings(
            tmp_path / str(len(started)),
            fake.base_url,
            otel={
                "enabled": True,
                "endpoint": endpoint,
                "schedule_delay_seconds": 0.05,
                "timeout_seconds": 2,
                **otel,
            },
        )
        started.append(GatewayThread(settings).__enter__())
        return started[-1]

    yield start
    for gateway in started:
        gateway.__exit__(None, None, None)


def chat(gateway: GatewayThread, text: str, **headers: str) -> str:
    raw = gateway.openai().chat.completions.with_raw_response.create(
        model="reef/support",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": text}],
        extra_headers=headers,
    )
    return raw.headers["x-reef-record-id"]


def span_of(receiver: OtlpReceiver, record_id: str) -> ReceivedSpan:
    def found() -> ReceivedSpan | None:
        return next(
            (s for s in receiver.spans if s.attributes.get("reef.record.id") == record_id), None
        )

    return eventually(found, f"the span of record {record_id}")


def test_one_genai_span_per_exchange_without_content_by_default(
    make_gateway: Callable[..., GatewayThread], receiver: OtlpReceiver
) -> None:
    gateway = make_gateway(receiver.traces_url, headers={"x-collector-key": "k-123"})
    record_id = chat(gateway, "where is my parcel", **{"x-reef-session": "sess-1"})
    span = span_of(receiver, record_id)
    record = gateway.store.get_record(record_id)

    assert span.name == "chat reef/support"
    assert span.kind == SPAN_KIND_CLIENT
    attributes = span.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "reef/support"
    assert attributes["gen_ai.response.model"] == record.response["model"]
    assert attributes["gen_ai.usage.input_tokens"] == record.usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == record.usage["completion_tokens"]
    assert attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert attributes["gen_ai.conversation.id"] == "sess-1"
    assert attributes["reef.session.id"] == "sess-1"
    assert attributes["reef.scenario"] == "support"
    assert attributes["reef.purpose"] == "serve"
    # Content is opt-in: neither the messages nor any text of them leaves by default.
    assert "gen_ai.input.messages" not in attributes
    assert "gen_ai.output.messages" not in attributes
    assert not any("parcel" in str(value) for value in attributes.values())
    # The span's ids derive from the record's, and its times from the record's latency.
    trace_id, span_id = trace_ids(record_id)
    assert (span.trace_id, span.span_id) == (f"{trace_id:032x}", f"{span_id:016x}")
    assert span.end_ns - span.start_ns == pytest.approx(record.latency_ms * 1e6, rel=0.01)
    assert span.resource["service.name"] == "reef"
    assert receiver.headers[0]["x-collector-key"] == "k-123"


def test_the_span_names_the_release_that_served_and_the_one_pinned(
    make_gateway: Callable[..., GatewayThread], receiver: OtlpReceiver
) -> None:
    gateway = make_gateway(receiver.traces_url)
    chain = ReleaseChain(gateway.database)
    head = chain.head("support")
    assert head is not None
    candidate = chain.propose(
        "support", ReleaseManifest(model=head.manifest.model), head.id, "test", "a candidate"
    )
    served = chat(gateway, "unpinned")
    pinned = chat(gateway, "pinned", **{"x-reef-release": candidate.id})
    plain, canary = span_of(receiver, served), span_of(receiver, pinned)
    assert plain.attributes["reef.release.id"] == head.id
    assert "reef.candidate.id" not in plain.attributes
    assert canary.attributes["reef.release.id"] == candidate.id  # the pinned one served it
    assert canary.attributes["reef.candidate.id"] == candidate.id


def test_feedback_is_an_evaluation_event_on_the_rated_span(
    make_gateway: Callable[..., GatewayThread], receiver: OtlpReceiver
) -> None:
    gateway = make_gateway(receiver.traces_url)
    record_id = chat(gateway, "refund please")
    record_span = span_of(receiver, record_id)
    posted = [
        call(gateway.port, "POST", "/reef/feedback", body)
        for body in (
            {
                "record_ids": [record_id],
                "score": 0.25,
                "feedback": "missed the refund policy",
                "correction": "Refunds take five days.",
            },
            {"record_ids": [record_id], "score": 0, "feedback": "thumbs_down"},
        )
    ]
    assert [response.status for response in posted] == [201, 201]
    spans = eventually(
        lambda: (found := receiver.named("evaluation feedback")) and len(found) == 2 and found,
        "the two feedback spans",
    )
    events = {}
    for span in spans:
        assert span.trace_id == record_span.trace_id
        assert span.parent_span_id == record_span.span_id
        assert span.links == [(record_span.trace_id, record_span.span_id)]
        ((name, event),) = span.events
        assert name == "gen_ai.evaluation.result"
        assert event["gen_ai.evaluation.name"] == "reef.feedback"
        assert event["reef.record.ids"] == [record_id]
        events[event["reef.feedback.id"]] = event
    explained, labelled = (events[response.json()["id"]] for response in posted)
    assert explained["gen_ai.evaluation.score.value"] == 0.25
    assert explained["gen_ai.evaluation.explanation"] == "missed the refund policy"
    assert "gen_ai.evaluation.score.label" not in explained
    assert "reef.feedback.correction" not in explained  # content stays home by default
    assert labelled["gen_ai.evaluation.score.value"] == 0.0
    assert labelled["gen_ai.evaluation.score.label"] == "thumbs_down"


def test_capture_content_sends_the_messages_in_the_parts_format(
    make_gateway: Callable[..., GatewayThread], receiver: OtlpReceiver
) -> None:
    gateway = make_gateway(receiver.traces_url, capture_content=True)
    record_id = chat(gateway, "where is my parcel")
    span = span_of(receiver, record_id)
    messages = json.loads(span.attributes["gen_ai.input.messages"])
    assert messages == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": "where is my parcel"}]},
    ]
    (output,) = json.loads(span.attributes["gen_ai.output.messages"])
    reply = gateway.store.get_record(record_id).response["choices"][0]["message"]["content"]
    assert output == {
        "role": "assistant",
        "parts": [{"type": "text", "content": reply}],
        "finish_reason": "stop",
    }


def test_capture_content_sends_a_correction_on_its_evaluation_event(
    make_gateway: Callable[..., GatewayThread], receiver: OtlpReceiver
) -> None:
    gateway = make_gateway(receiver.traces_url, capture_content=True)
    record_id = chat(gateway, "refund please")
    correction = {"role": "assistant", "content": "Refunds take five days."}
    body = {"record_ids": [record_id], "score": 0, "correction": correction}
    assert call(gateway.port, "POST", "/reef/feedback", body).status == 201
    (span,) = eventually(
        lambda: receiver.named("evaluation feedback"), "the feedback span with its correction"
    )
    ((_, event),) = span.events
    assert json.loads(event["reef.feedback.correction"]) == correction


def test_an_upstream_error_sets_the_span_status(
    make_gateway: Callable[..., GatewayThread], receiver: OtlpReceiver
) -> None:
    gateway = make_gateway(receiver.traces_url)
    with pytest.raises(openai.BadRequestError):
        gateway.openai().chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": "bad-request"}]
        )
    spans = eventually(lambda: receiver.named("chat"), "the failed exchange's span")
    assert spans[0].status_code == STATUS_CODE_ERROR
    assert spans[0].attributes["error.type"] == "error"
    assert spans[0].attributes["reef.status"] == "error"


def test_a_collector_that_is_down_fails_no_request_and_is_counted(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(f"http://127.0.0.1:{free_port()}/v1/traces", timeout_seconds=0.5)
    for text in ("one", "two", "three"):
        assert chat(gateway, text)

    def failures() -> float | None:
        metrics = call(gateway.port, "GET", "/metrics").body.decode()
        for line in metrics.splitlines():
            if line.startswith("reef_otel_export_failures_total "):
                value = float(line.split()[1])
                return value if value >= 1 else None
        return None

    assert eventually(failures, "a failed export counted in /metrics") >= 1


def test_grpc_export_reaches_a_grpc_receiver(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    with OtlpGrpcReceiver() as receiver:
        gateway = make_gateway(receiver.endpoint, protocol="grpc")
        record_id = chat(gateway, "hello over grpc")

        def found() -> ReceivedSpan | None:
            return next(
                (s for s in receiver.spans if s.attributes.get("reef.record.id") == record_id),
                None,
            )

        span = eventually(found, "the span over gRPC")
        assert span.name == "chat reef/support"
        assert span.attributes["gen_ai.operation.name"] == "chat"


def test_a_stream_is_one_span_when_it_ends(
    make_gateway: Callable[..., GatewayThread], receiver: OtlpReceiver
) -> None:
    gateway = make_gateway(receiver.traces_url)
    with gateway.openai().chat.completions.with_streaming_response.create(
        model="reef/support", messages=[{"role": "user", "content": "stream it"}], stream=True
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        chunks = list(response.iter_lines())
    assert chunks
    span = span_of(receiver, record_id)
    record = gateway.store.get_record(record_id)
    assert record.status == "ok"
    assert span.attributes["reef.status"] == "ok"
    assert span.attributes["gen_ai.usage.output_tokens"] == record.usage["completion_tokens"]
    # Every span queued so far is out: the stream's pending row sent none of its own.
    assert gateway.app.state.reef.live_export.flush(timeout_seconds=10)
    assert [s.name for s in receiver.spans] == ["chat reef/support"]

"""The export process encodes a record straight from its wire fields
(``exporter.encode_record``): the same bytes as describing it (``exporter.describe``,
the attributes of ``reef.telemetry.attributes``) and encoding the description
(``otlp_proto.span``), for every dialect, status and option; and those bytes parse as
the span the description says."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from reef.config import OtelConfig
from reef.core import dumps, loads
from reef.experience import RecordDraft
from reef.telemetry import exporter, otlp_proto
from reef.telemetry.attributes import finish_reasons, trace_ids
from reef.telemetry.live import wire_record
from tests.telemetry.test_attributes import ANTHROPIC_REQUEST, ANTHROPIC_RESPONSE

CHAT_REQUEST = {
    "model": "reef/support",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "héllo " * 40},  # past 127 bytes: two-byte lengths
    ],
}
CHAT_RESPONSE = {
    "id": "chatcmpl-1",
    "model": "reef/support-2026",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": "ho"}, "finish_reason": "length"},
    ],
    "usage": {"prompt_tokens": 300, "completion_tokens": 1, "total_tokens": 301},
}
RESPONSES_RESPONSE = {"id": "resp_1", "model": "m", "status": "completed", "output": []}


def record(
    api: Any,
    request: dict[str, Any],
    response: dict[str, Any] | None,
    status: Any = "ok",
    error: str | None = None,
    release_id: str | None = "rel-2",
    serial: int = 1,
) -> RecordDraft:
    return RecordDraft(
        id=f"rec-{serial}",
        scenario="support",
        session_id=f"sess-{serial % 3}",
        api=api,
        request=request,
        response=response,
        status=status,
        error=error,
        latency_ms=12.5 + serial,
        usage=(response or {}).get("usage"),
        release_id=release_id,
        prompt_hash="p",
        content_hash="c",
        continuation_hash=None,
    )


RECORDS = [
    record("openai.chat", CHAT_REQUEST, CHAT_RESPONSE),
    # Ids past a one-byte length, token counts past the kept ones and below zero.
    replace(
        record(
            "openai.chat",
            CHAT_REQUEST,
            {
                **CHAT_RESPONSE,
                "id": "chatcmpl-" + "r" * 150,
                "choices": CHAT_RESPONSE["choices"][:1],
            },
            serial=4,
        ),
        id="rec-" + "é" * 100,
        session_id="sess-" + "s" * 130,
        usage={"input_tokens": 70_000, "prompt_tokens": 3, "output_tokens": -1},
    ),
    record("anthropic.messages", ANTHROPIC_REQUEST, ANTHROPIC_RESPONSE, release_id=None),
    record("openai.responses", {"model": "m", "input": "hi"}, RESPONSES_RESPONSE),
    record("openai.embeddings", {"model": "e5", "input": "hi"}, {"data": [], "model": "e5"}),
    record("openai.completions", {"model": "m", "prompt": "hi"}, None, "error", "upstream 500"),
    record("openai.chat", {"messages": []}, None, "aborted", serial=2),  # no model
    record("openai.chat", {"model": "", "messages": []}, {"choices": []}, serial=3),
]


@pytest.mark.parametrize("capture_content", [False, True])
@pytest.mark.parametrize("pinned", [None, "cand-7"])
@pytest.mark.parametrize("draft", RECORDS, ids=[f"{r.api}-{r.status}" for r in RECORDS])
def test_a_record_encodes_to_the_bytes_of_its_description(
    draft: RecordDraft, pinned: str | None, capture_content: bool
) -> None:
    # As the export process reads it: through the JSON of the pipe.
    item = loads(
        dumps(wire_record(draft, "openai", pinned, 1_733_370_000_000_000_000, capture_content))
    )
    expected = otlp_proto.span(exporter.describe(item, capture_content))
    # Twice: the second time from the kept encodings of repeating attributes.
    assert exporter.encode_record(item, capture_content) == expected
    assert exporter.encode_record(item, capture_content) == expected


def test_a_batch_parses_as_the_spans_described() -> None:
    config = OtelConfig(enabled=True, capture_content=True)
    items = [loads(dumps(wire_record(r, "anthropic", None, 10**18, True))) for r in RECORDS]
    batches, broken = exporter.encode(items, config, {"service.name": "reef"})
    assert broken == 0
    (request,) = [ExportTraceServiceRequest.FromString(b.payload) for b in batches]
    spans = request.resource_spans[0].scope_spans[0].spans
    assert len(spans) == len(RECORDS)
    for span, draft in zip(spans, RECORDS, strict=True):
        trace_id, span_id = trace_ids(draft.id)
        assert (span.trace_id.hex(), span.span_id.hex()) == (f"{trace_id:032x}", f"{span_id:016x}")
        attributes = {kv.key: kv.value for kv in span.attributes}
        assert attributes["reef.record.id"].string_value == draft.id
        assert attributes["gen_ai.provider.name"].string_value == "anthropic"
        assert span.end_time_unix_nano - span.start_time_unix_nano == int(draft.latency_ms * 1e6)
        assert ("gen_ai.input.messages" in attributes) is True
        assert (span.status.code == 2) is (draft.status != "ok")


def test_a_malformed_record_is_skipped_and_counted_not_fatal() -> None:
    config = OtelConfig(enabled=True)
    good = loads(dumps(wire_record(RECORDS[0], "openai", None, 10**18, False)))
    no_session = [*good[:1], None, *good[2:]]  # an attribute OTLP cannot hold
    batches, broken = exporter.encode([good, no_session, good[:3]], config, {})
    assert broken == 2
    assert [b.spans for b in batches] == [1]


def test_unusual_values_encode_as_the_general_path_does() -> None:
    """Values of other types than the gateway writes (a list, an int, a bool equal to
    the int before it) take the general path or a kept encoding of their own type."""
    good = loads(dumps(wire_record(RECORDS[0], "openai", None, 10**18, False)))
    scenario, provider, release = (
        exporter.RECORD_FIELDS.index(name) for name in ("scenario", "provider", "release_id")
    )
    variants = []
    for field, value in [
        (scenario, ["a", "b"]),
        (provider, 1),
        (provider, True),
        (scenario, 1),
        (scenario, True),
        (release, 7),
    ]:
        item = list(good)
        item[field] = value
        variants.append(item)
    for item in variants:
        expected = otlp_proto.span(exporter.describe(item, False))
        assert exporter.encode_record(item, False) == expected


@pytest.mark.parametrize(
    "response",
    [
        CHAT_RESPONSE,
        {"choices": [{"finish_reason": "stop"}]},
        {"choices": [{"finish_reason": ""}]},
        {"choices": [{"finish_reason": 3}]},
        {"choices": [{"finish_reason": None}]},
        {"choices": ["stop"]},
        {"choices": []},
        {"choices": {"finish_reason": "stop"}, "stop_reason": "end_turn"},
        ANTHROPIC_RESPONSE,
        RESPONSES_RESPONSE,
        None,
    ],
)
def test_the_gateway_sends_the_finish_reasons_the_attributes_read(
    response: dict[str, Any] | None,
) -> None:
    draft = record("openai.chat", CHAT_REQUEST, response)
    wire = wire_record(draft, "openai", None, 1, False)
    reasons = wire[exporter.RECORD_FIELDS.index("finish_reasons")]
    assert reasons == finish_reasons(response or {})

"""The ``otel`` import format: OTLP/JSON spans with GenAI attributes, from fixtures
written after the public conventions and from what Reef's own live export sends."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.experience import (
    ORIGIN_TAG,
    SOURCE_TAG,
    FeedbackDraft,
    ImportLineError,
    RecordDraft,
    SQLExperienceStore,
)
from reef.experience.importing import READERS
from reef.experience.importing.otel import otlp_attributes
from reef.telemetry.attributes import (
    EVALUATION_EVENT,
    feedback_attributes,
    record_attributes,
    span_name,
    trace_ids,
)
from reef.upstream import canonical_reply, canonical_request
from tests.experience.conftest import (  # noqa: F401 - fixtures
    pg_databases,
    pg_url,
    store_url,
)
from tests.experience.importing_helpers import run_import
from tests.telemetry.test_attributes import ANTHROPIC_REQUEST, ANTHROPIC_RESPONSE

DATA = Path(__file__).resolve().parents[1] / "data" / "import"


@pytest.fixture
def store(store_url: str) -> Iterator[SQLExperienceStore]:  # noqa: F811 - fixture
    opened = SQLExperienceStore.from_url(store_url)
    yield opened
    opened.close()


def otlp_span(
    ids: tuple[int, int],
    name: str,
    attributes: dict[str, Any],
    events: list[tuple[str, dict[str, Any]]] = (),  # type: ignore[assignment]
    parent: int | None = None,
    start: int = 1_700_000_000_000_000_000,
) -> dict[str, Any]:
    """One span in OTLP/JSON form."""
    span: dict[str, Any] = {
        "traceId": f"{ids[0]:032x}",
        "spanId": f"{ids[1]:016x}",
        "name": name,
        "kind": 3,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 250_000_000),
        "attributes": otlp_attributes(attributes),
        "events": [
            {"timeUnixNano": str(start), "name": n, "attributes": otlp_attributes(a)}
            for n, a in events
        ],
        "status": {},
    }
    if parent is not None:
        span["parentSpanId"] = f"{parent:016x}"
    return span


def export_request(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """An ``ExportTraceServiceRequest`` as the Collector's file exporter writes it."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": otlp_attributes({"service.name": "reef"})},
                "scopeSpans": [{"scope": {"name": "reef"}, "spans": spans}],
            }
        ]
    }


TOOLS_REQUEST = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are the weather desk."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "rainy, 57F"},
        {"role": "user", "content": "And tomorrow?"},
    ],
}
TOOLS_RESPONSE = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Paris", "day": "tomorrow"}',
                        },
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49},
}


def draft(
    record_id: str,
    request: dict[str, Any],
    response: dict[str, Any],
    api: str = "openai.chat",
) -> RecordDraft:
    return RecordDraft(
        id=record_id,
        scenario="live",
        session_id="conv-7",
        api=api,  # type: ignore[arg-type]
        request=request,
        response=response,
        status="ok",
        error=None,
        latency_ms=250.0,
        usage=response.get("usage"),
        release_id="rel-1",
        prompt_hash="p",
        content_hash="c",
        continuation_hash=None,
    )


def test_what_the_live_export_sends_imports_back_to_the_same_conversation(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    first = draft(
        "rec-a",
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
        {
            "id": "chatcmpl-0",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello! How can I help?"},
                    "finish_reason": "stop",
                }
            ],
        },
    )
    second = draft("rec-b", TOOLS_REQUEST, TOOLS_RESPONSE)
    third = draft("rec-c", ANTHROPIC_REQUEST, ANTHROPIC_RESPONSE, "anthropic.messages")
    spans = [
        otlp_span(trace_ids(d.id), span_name(d), record_attributes(d, "openai", None, True))
        for d in (first, second, third)
    ]
    rating = FeedbackDraft(
        scenario="live",
        record_ids=("rec-b",),
        score=0.0,
        feedback="thumbs_down",
        correction="Tomorrow in Paris: sunny, 64F.",
        metadata={},
        principal="alice",
        idempotency_key=None,
    )
    event = feedback_attributes(rating, "fb-1", capture_content=True)
    evaluation = otlp_span(
        (trace_ids("rec-b")[0], 77),
        "evaluation feedback",
        {},
        [(EVALUATION_EVENT, event)],
        parent=trace_ids("rec-b")[1],
    )
    path = tmp_path / "live.jsonl"
    # The records in one export request, the evaluation in a later one (another line).
    path.write_text(
        json.dumps(export_request(spans)) + "\n" + json.dumps(export_request([evaluation])) + "\n"
    )

    summary = run_import(store, path, tmp_path, fmt="auto")

    assert (summary.records, summary.feedback, summary.skipped) == (3, 1, 0), summary
    stored = {r.tags[SOURCE_TAG]: r for r in store.iter_export("s")}
    # An Anthropic exchange comes back in chat completions form: the same canonical
    # conversation and answer (tool use and tool results included).
    for original in (first, second, third):
        trace_id, span_id = trace_ids(original.id)
        record = stored[f"{trace_id:032x}{span_id:016x}"]
        assert record.tags[ORIGIN_TAG] == "import:otel"
        assert record.session_id == "conv-7"
        assert canonical_request(record.api, record.request) == canonical_request(
            original.api, original.request
        )
        assert record.response is not None and original.response is not None
        assert canonical_reply(record.api, record.response) == canonical_reply(
            original.api, original.response
        )
        if original.usage is None:
            assert record.usage is None
        else:
            assert record.usage is not None
            assert record.usage["prompt_tokens"] == original.usage.get(
                "prompt_tokens", original.usage.get("input_tokens")
            )
    rated = stored[f"{trace_ids('rec-b')[0]:032x}{trace_ids('rec-b')[1]:016x}"]
    (feedback,) = rated.feedback
    assert feedback.score == 0.0
    assert feedback.feedback == "thumbs_down"
    assert feedback.correction == "Tomorrow in Paris: sunny, 64F."
    assert feedback.principal == "import:otel"

    again = run_import(store, path, tmp_path, fmt="otel")
    assert (again.records, again.feedback) == (0, 0)
    assert (again.duplicate_records, again.duplicate_feedback) == (3, 1)


def by_source(store: SQLExperienceStore) -> dict[str, Any]:
    return {r.tags[SOURCE_TAG]: r for r in store.iter_export("s")}


def test_collector_file_export_with_tool_calls_turns_and_evaluations(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    summary = run_import(store, DATA / "otel.jsonl", tmp_path, fmt="auto")

    # Four chat spans (the embeddings span is not an exchange), three evaluation events.
    assert (summary.records, summary.feedback, summary.skipped) == (4, 3, 0), summary
    stored = by_source(store)
    trace = "5b8aa5a2d2c872e8321cf37308d69df2"
    first, second, third = (
        stored[trace + span]
        for span in ("6e0c63257de34c92", "b7ad6b7169203331", "00f067aa0ba902b7")
    )
    assert {first.session_id, second.session_id, third.session_id} == {
        "conv_5j66UpCpwteGg4YSxUnt7lPY"
    }
    assert first.request["messages"][0] == {
        "role": "system",
        "content": "You are a helpful weather assistant.",
    }
    assert first.response is not None
    (call,) = first.response["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"location":"Paris"}'}
    assert first.usage == {"prompt_tokens": 97, "completion_tokens": 52, "total_tokens": 149}
    assert first.created_at.timestamp() == pytest.approx(1733300000.0)
    tool_turn = second.request["messages"][3]
    assert tool_turn == {
        "role": "tool",
        "tool_call_id": "call_VSPygqKTWdrhaFErNvMV18Yl",
        "content": "rainy, 57°F",
    }
    (relevance,) = second.feedback
    assert (relevance.score, relevance.feedback) == (0.92, "relevant")
    assert relevance.metadata == {
        "evaluation": "Relevance",
        "explanation": "The answer states the weather the tool returned.",
    }
    # The evaluation span in a later batch lands on its parent span's record.
    (correctness,) = third.feedback
    assert correctness.score == 0.0
    assert correctness.correction == "Yes: rain is expected all day, so take an umbrella."
    assert len(third.request["messages"]) == 6
    # Content from the operation-details event; no conversation id: a session of its own.
    single = stored["0af7651916cd43dd8448eb211c80319c" + "a2fb4a1d1a96d312"]
    assert single.response is not None
    assert single.response["choices"][0]["message"]["content"] == "Bonjour."
    assert single.session_id not in {first.session_id}
    assert [f.score for f in single.feedback] == [1.0]


def test_older_instrumentations_prompt_attributes_and_events(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    summary = run_import(store, DATA / "otel-legacy.jsonl", tmp_path, fmt="auto")

    assert (summary.records, summary.feedback, summary.skipped) == (2, 1, 0), summary
    stored = by_source(store)
    indexed = stored["9a2b" * 8 + "1c2d" * 4]
    assert [m["role"] for m in indexed.request["messages"]] == ["system", "user"]
    assert indexed.response is not None
    assert indexed.response["choices"][0]["message"]["content"] == "The capital of Japan is Tokyo."
    assert indexed.usage == {"prompt_tokens": 24, "completion_tokens": 8, "total_tokens": 32}
    assert [(f.score, f.feedback) for f in indexed.feedback] == [(1.0, "thumbs_up")]
    evented = stored["e4a1" * 8 + "77ab" * 4]
    assert evented.session_id == "legacy-session-1"
    assert evented.request["messages"] == [
        {"role": "user", "content": "Book a table for two at 7pm."}
    ]
    assert evented.response is not None
    (call,) = evented.response["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "book_table"


def test_a_span_without_content_is_skipped_saying_why(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    path = tmp_path / "bare.jsonl"
    bare = otlp_span((1, 2), "chat m", {"gen_ai.operation.name": "chat"})
    path.write_text(json.dumps(export_request([bare])) + "\n")

    summary = run_import(store, path, tmp_path, fmt="otel")

    assert summary.records == 0
    assert "content capture" in json.dumps(summary.as_dict())


def test_an_evaluation_of_a_span_never_imported_is_reported(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    path = tmp_path / "orphan.jsonl"
    orphan = otlp_span(
        (5, 6), "evaluation", {}, [(EVALUATION_EVENT, {"gen_ai.evaluation.score.value": 1.0})], 9
    )
    path.write_text(json.dumps(export_request([orphan])) + "\n")

    summary = run_import(store, path, tmp_path, fmt="otel")

    assert (summary.records, summary.feedback) == (0, 0)
    assert "no imported record has source id" in json.dumps(summary.as_dict())


def test_one_bad_span_costs_only_itself_and_other_spans_add_nothing(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    good_messages = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": "hello"}]}]
        ),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": "hi"}]}]
        ),
    }
    good = otlp_span((1, 1), "chat m", good_messages)
    broken = otlp_span((1, 2), "chat m", {**good_messages, "gen_ai.input.messages": "{oops"})
    http = otlp_span((1, 3), "GET /orders", {"http.request.method": "GET"})
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        json.dumps(export_request([good, broken, http]))
        + "\n"
        + json.dumps(export_request([http]))
        + "\n"
    )

    summary = run_import(store, path, tmp_path, fmt="otel")

    assert (summary.records, summary.skipped) == (1, 1), summary
    ((_, line, reason),) = summary.skips
    assert line == 1 and "gen_ai.input.messages is not JSON" in reason
    with pytest.raises(ImportLineError, match="not JSON"):
        run_import(store, path, tmp_path / "strict", fmt="otel", strict=True)


def test_ids_in_base64_as_the_protobuf_json_mapping_writes_them() -> None:
    span = otlp_span((0xAB, 0xCD), "chat m", {"gen_ai.operation.name": "chat"})
    span["traceId"] = base64.b64encode(bytes.fromhex(f"{0xAB:032x}")).decode()
    span["spanId"] = base64.b64encode(bytes.fromhex(f"{0xCD:016x}")).decode()
    span["events"] = [
        {
            "name": "gen_ai.client.inference.operation.details",
            "attributes": otlp_attributes(
                {
                    "gen_ai.input.messages": json.dumps(
                        [{"role": "user", "parts": [{"type": "text", "content": "a"}]}]
                    ),
                    "gen_ai.output.messages": '[{"role":"assistant","parts":[]}]',
                }
            ),
        }
    ]

    item = READERS["otel"].read(export_request([span]))

    (record,) = item.records
    assert record.source_id == f"{0xAB:032x}{0xCD:016x}"
    assert item.problems == ()

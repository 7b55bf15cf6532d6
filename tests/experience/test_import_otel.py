"""The ``otel`` import format: OTLP/JSON spans with GenAI attributes, from fixtures
written after the public conventions and from what Reef's own live export sends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.experience import (
    ORIGIN_TAG,
    SOURCE_TAG,
    FeedbackDraft,
    ImportOptions,
    ImportSummary,
    RecordDraft,
    SQLExperienceStore,
    import_file,
)
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

DATA = Path(__file__).resolve().parents[1] / "data" / "import"


@pytest.fixture
def store(store_url: str) -> Iterator[SQLExperienceStore]:  # noqa: F811 - fixture
    opened = SQLExperienceStore.from_url(store_url)
    yield opened
    opened.close()


def run_import(
    store: SQLExperienceStore, path: Path, tmp_path: Path, **options: Any
) -> ImportSummary:
    summary = ImportSummary()
    settings: dict[str, Any] = {"scenario": "s", "checkpoint_dir": tmp_path / "imports"}
    import_file(store, path, ImportOptions(**{**settings, **options}), summary)
    return summary


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


def draft(record_id: str, request: dict[str, Any], response: dict[str, Any]) -> RecordDraft:
    return RecordDraft(
        id=record_id,
        scenario="live",
        session_id="conv-7",
        api="openai.chat",
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
    spans = [
        otlp_span(trace_ids(d.id), span_name(d), record_attributes(d, "openai", None, True))
        for d in (first, second)
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
    event = {**feedback_attributes(rating, "fb-1"), "reef.feedback.correction": rating.correction}
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

    assert (summary.records, summary.feedback, summary.skipped) == (2, 1, 0), summary
    stored = {r.tags[SOURCE_TAG]: r for r in store.iter_export("s")}
    for original in (first, second):
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
        assert record.usage == original.usage
    rated = stored[f"{trace_ids('rec-b')[0]:032x}{trace_ids('rec-b')[1]:016x}"]
    (feedback,) = rated.feedback
    assert feedback.score == 0.0
    assert feedback.feedback == "thumbs_down"
    assert feedback.correction == "Tomorrow in Paris: sunny, 64F."
    assert feedback.principal == "import:otel"

    again = run_import(store, path, tmp_path, fmt="otel")
    assert (again.records, again.feedback) == (0, 0)
    assert (again.duplicate_records, again.duplicate_feedback) == (2, 1)

"""The GenAI attributes of records of each dialect, and gate results, sent for real."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from reef.config import OtelConfig
from reef.experience import RecordDraft
from reef.telemetry.attributes import record_attributes, span_name
from reef.telemetry.live import LiveExport
from tests.fakes.otlp import OtlpReceiver


def draft(api: Any, request: dict[str, Any], response: dict[str, Any] | None) -> RecordDraft:
    usage = (response or {}).get("usage")
    return RecordDraft(
        id="rec-1",
        scenario="support",
        session_id="sess-1",
        api=api,
        request=request,
        response=response,
        status="ok" if response else "error",
        error=None if response else "upstream refused",
        latency_ms=12.5,
        usage=usage,
        release_id="rel-2",
        prompt_hash="p",
        content_hash="c",
        continuation_hash=None,
        purpose="eval",
    )


ANTHROPIC_REQUEST = {
    "model": "claude-x",
    "system": "be brief",
    "messages": [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "tu_1", "name": "weather", "input": {"city": "Paris"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "18C"}],
        },
    ],
}
ANTHROPIC_RESPONSE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x-2026",
    "content": [{"type": "text", "text": "18C and sunny"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 30, "output_tokens": 5},
}


def test_an_anthropic_exchange_with_tool_calls_in_the_parts_format() -> None:
    record = draft("anthropic.messages", ANTHROPIC_REQUEST, ANTHROPIC_RESPONSE)
    attributes = record_attributes(record, "anthropic", "cand-7", capture_content=True)
    assert span_name(record) == "chat claude-x"
    assert attributes["gen_ai.provider.name"] == "anthropic"
    assert attributes["gen_ai.response.model"] == "claude-x-2026"
    assert attributes["gen_ai.response.id"] == "msg_1"
    assert attributes["gen_ai.usage.input_tokens"] == 30
    assert attributes["gen_ai.usage.output_tokens"] == 5
    assert attributes["gen_ai.response.finish_reasons"] == ["end_turn"]
    assert attributes["reef.release.id"] == "rel-2"
    assert attributes["reef.candidate.id"] == "cand-7"
    assert attributes["reef.purpose"] == "eval"
    messages = json.loads(str(attributes["gen_ai.input.messages"]))
    assert messages[0] == {"role": "system", "parts": [{"type": "text", "content": "be brief"}]}
    assert messages[2] == {
        "role": "assistant",
        "parts": [
            {"type": "tool_call", "id": "tu_1", "name": "weather", "arguments": {"city": "Paris"}}
        ],
    }
    assert messages[3] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "tu_1", "response": "18C"}],
    }
    assert json.loads(str(attributes["gen_ai.output.messages"])) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "18C and sunny"}],
            "finish_reason": "end_turn",
        }
    ]


def test_without_capture_content_no_message_leaves() -> None:
    record = draft("anthropic.messages", ANTHROPIC_REQUEST, ANTHROPIC_RESPONSE)
    attributes = record_attributes(record, "anthropic", None, capture_content=False)
    assert not {"gen_ai.input.messages", "gen_ai.output.messages"} & set(attributes)
    assert "reef.candidate.id" not in attributes
    assert not any("Paris" in str(value) for value in attributes.values())


def test_embeddings_and_completions_name_their_operation() -> None:
    embeddings = draft("openai.embeddings", {"model": "e5", "input": "hi"}, None)
    completions = draft("openai.completions", {"model": "m", "prompt": "hi"}, None)
    assert span_name(embeddings) == "embeddings e5"
    assert span_name(completions) == "text_completion m"
    failed = record_attributes(completions, "openai", None, capture_content=True)
    assert failed["error.type"] == "error"
    assert "gen_ai.output.messages" not in failed


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as server:
        yield server


def test_a_gate_result_is_an_evaluation_event(receiver: OtlpReceiver) -> None:
    live = LiveExport(OtelConfig(enabled=True, endpoint=receiver.traces_url))
    try:
        live.gate("support", "cand-7", "eval-3", "passed", 0.82)
        assert live.flush(timeout_seconds=10)
    finally:
        live.shutdown()
    (span,) = receiver.named("evaluation gate")
    ((name, event),) = span.events
    assert name == "gen_ai.evaluation.result"
    assert event == {
        "gen_ai.evaluation.name": "reef.gate",
        "gen_ai.evaluation.score.label": "passed",
        "gen_ai.evaluation.score.value": 0.82,
        "reef.evaluation.id": "eval-3",
        "reef.candidate.id": "cand-7",
        "reef.scenario": "support",
    }
    assert live.failed_exports == 0

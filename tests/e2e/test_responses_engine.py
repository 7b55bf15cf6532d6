"""The Responses API on the embedded engine: ``client.responses.create``, plain and
streamed, through a gateway whose scenario is served by the tiny in-process model; each
answer is the engine's own (greedy, so the same as its chat completion) and recorded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.upstream import canonical_request
from tests.e2e.tiny import tiny_gateway
from tests.gateway.harness import GatewayThread

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    pytest.importorskip("torch")
    tmp_path: Path = tmp_path_factory.mktemp("responses-engine")
    with tiny_gateway(tmp_path, scenarios={"tiny": {"upstream": "engine"}}) as gw:
        yield gw


def _engine_says(gateway: GatewayThread, instructions: str, text: str) -> str:
    """The engine's own greedy answer to the same conversation, asked directly."""
    base_url = gateway.settings.upstreams["engine"].base_url
    with openai.OpenAI(base_url=base_url, api_key="none", max_retries=0) as engine:
        completion = engine.chat.completions.create(
            model="tiny-random",
            messages=[
                {"role": "system", "content": instructions},
                {"role": "user", "content": text},
            ],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
    return completion.choices[0].message.content or ""


def test_a_response_from_the_engine_is_its_answer_and_recorded(gateway: GatewayThread) -> None:
    raw = gateway.openai().responses.with_raw_response.create(
        model="reef/tiny",
        instructions="Answer briefly.",
        input="which code for case 3?",
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    response = raw.parse()
    expected = _engine_says(gateway, "Answer briefly.", "which code for case 3?")
    assert expected and response.output_text == expected
    assert response.status in ("completed", "incomplete")
    assert response.usage is not None and 0 < response.usage.output_tokens <= MAX_TOKENS
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.api == "openai.responses" and record.status == "ok"
    assert record.scenario == "tiny" and record.release_id == raw.headers["x-reef-release-id"]
    assert record.response is not None
    assert record.response["output"][0]["content"][0]["text"] == expected
    assert canonical_request(record.api, record.request) == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "which code for case 3?"},
    ]
    # and it continues: the next turn joins its session
    follow = gateway.openai().responses.with_raw_response.create(
        model="reef/tiny",
        previous_response_id=response.id,
        input="and case 4?",
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert follow.parse().output_text
    second = gateway.store.get_record(follow.headers["x-reef-record-id"])
    assert second.session_id == record.session_id and second.turn == 1


def test_a_streamed_response_from_the_engine_is_its_answer_and_recorded(
    gateway: GatewayThread,
) -> None:
    raw = gateway.openai().responses.with_raw_response.create(
        model="reef/tiny",
        instructions="Answer briefly.",
        input="which code for case 5?",
        max_output_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    events = list(raw.parse())
    assert events[0].type == "response.created"
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    expected = _engine_says(gateway, "Answer briefly.", "which code for case 5?")
    assert expected and deltas == expected and final.response.output_text == expected
    assert final.x_reef["record_id"] == raw.headers["x-reef-record-id"]
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.api == "openai.responses" and record.status == "ok"
    assert record.response is not None and record.response["id"] == final.response.id
    assert record.response["output"][0]["content"][0]["text"] == expected
    assert record.usage is not None and record.usage["output_tokens"] > 0


def test_a_function_call_output_reaches_the_engine_as_a_tool_message(
    gateway: GatewayThread,
) -> None:
    """The tool half of a loop (the tiny model calls no tools itself): the call and its
    output go to the engine as an assistant tool call and a tool message."""
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    items = [
        {"type": "message", "role": "user", "content": "weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    raw = gateway.openai().responses.with_raw_response.create(
        model="reef/tiny",
        input=items,  # type: ignore[arg-type]
        tools=[tool],  # type: ignore[list-item]
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert raw.parse().status in ("completed", "incomplete")
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.status == "ok"
    assert [m["role"] for m in canonical_request(record.api, record.request)] == [
        "user",
        "assistant",
        "tool",
    ]

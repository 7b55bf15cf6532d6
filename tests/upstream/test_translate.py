"""Anthropic ⇄ OpenAI translation: requests, responses and streams."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from reef.upstream.assemble import AnthropicStreamAssembler, OpenAIStreamAssembler
from reef.upstream.base import UpstreamTruncatedError
from reef.upstream.translate import (
    RAW_ARGUMENTS_KEY,
    OpenAIToAnthropicStream,
    anthropic_request_to_openai,
    openai_response_to_anthropic,
)

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_request_system_messages_and_sampling() -> None:
    body = {
        "model": "claude-x",
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 5,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u1"},
        "stream": True,
        "thinking": {"type": "enabled"},
    }
    assert anthropic_request_to_openai(body, "up-model") == {
        "model": "up-model",
        "messages": [
            {"role": "system", "content": "Be brief.\nBe kind."},
            {"role": "user", "content": "hi"},
        ],
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["END"],
        "user": "u1",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_request_system_string_and_image() -> None:
    body = {
        "system": "S",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"},
                    },
                ],
            }
        ],
    }
    messages = anthropic_request_to_openai(body, "m")["messages"]
    assert messages == [
        {"role": "system", "content": "S"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
            ],
        },
    ]


def test_request_tool_use_and_tool_results_keep_order() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "t2",
                        "name": "get_weather",
                        "input": {"city": "Rome"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "thanks"},
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [
                            {"type": "text", "text": "rain"},
                            {"type": "text", "text": "cold"},
                        ],
                        "is_error": True,
                    },
                ],
            },
        ],
        "tools": [WEATHER_TOOL, {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    }
    out = anthropic_request_to_openai(body, "m")
    assert out["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "t2", "content": "[error] rain\ncold"},
        {"role": "user", "content": "thanks"},
    ]
    assert out["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER_TOOL["input_schema"],
                "description": "Weather in a city",
            },
        }
    ]
    assert out["tool_choice"] == "auto"
    assert out["parallel_tool_calls"] is False


def test_assistant_with_only_tool_use_has_null_content() -> None:
    body = {
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            }
        ]
    }
    [message] = anthropic_request_to_openai(body, "m")["messages"]
    assert message["content"] is None
    assert message["tool_calls"][0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        (
            {"type": "tool", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    body = {"messages": [], "tools": [WEATHER_TOOL], "tool_choice": choice}
    assert anthropic_request_to_openai(body, "m")["tool_choice"] == expected


def openai_response(**message: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1,
        "model": "up",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": message.pop("finish_reason", "stop"),
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }


def test_response_text() -> None:
    out = openai_response_to_anthropic(openai_response(content="hello"), "claude-x")
    assert out == {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": "hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }
    Message.model_validate(out)


def test_response_tool_calls_and_bad_arguments() -> None:
    resp = openai_response(
        content=None,
        tool_calls=[
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "f", "arguments": '{"city": "Paris"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{oops"}},
            {"id": "call_3", "type": "function", "function": {"name": "h", "arguments": ""}},
        ],
    )
    resp["choices"][0]["finish_reason"] = "tool_calls"
    out = openai_response_to_anthropic(resp, "m")
    assert out["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "g", "input": {RAW_ARGUMENTS_KEY: "{oops"}},
        {"type": "tool_use", "id": "call_3", "name": "h", "input": {}},
    ]
    assert out["stop_reason"] == "tool_use"
    Message.model_validate(out)


def test_raw_arguments_round_trip_to_the_same_text() -> None:
    out = openai_response_to_anthropic(
        openai_response(
            content=None,
            tool_calls=[
                {"id": "c", "type": "function", "function": {"name": "g", "arguments": "{oops"}}
            ],
        ),
        "m",
    )
    body = {"messages": [{"role": "assistant", "content": out["content"]}]}
    [message] = anthropic_request_to_openai(body, "m")["messages"]
    assert message["tool_calls"][0]["function"]["arguments"] == "{oops"


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
    ],
)
def test_stop_reasons(finish: str, stop: str) -> None:
    resp = openai_response(content="x")
    resp["choices"][0]["finish_reason"] = finish
    assert openai_response_to_anthropic(resp, "m")["stop_reason"] == stop


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-s1",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "up",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def tool_delta(
    index: int, arguments: str, call_id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id:
        call.update(id=call_id, type="function")
        call["function"]["name"] = name
    return {"tool_calls": [call]}


CHUNKS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Let me "}),
    chunk({"content": "check."}),
    chunk(tool_delta(0, "", "call_a", "get_weather")),
    chunk(tool_delta(0, '{"city": ')),
    chunk(tool_delta(0, '"Paris"}')),
    chunk(tool_delta(1, '{"city"', "call_b", "get_weather")),
    chunk(tool_delta(1, ': "Rome"}')),
    chunk({}, "tool_calls"),
    {
        "id": "chatcmpl-s1",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "up",
        "choices": [],
        "usage": {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20},
    },
]


def translate_stream(chunks: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    stream = OpenAIToAnthropicStream("claude-x")
    events = [event for c in chunks for event in stream.feed(c)]
    return events + stream.finish()


def test_stream_events_and_block_indices() -> None:
    events = translate_stream(CHUNKS)
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    for name, data in events:
        assert data["type"] == name
        adapter.validate_python(data)
    names = [(name, data.get("index")) for name, data in events]
    assert names == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[-2][1]["usage"] == {"input_tokens": 11, "output_tokens": 9}


def test_stream_matches_translated_assembled_response() -> None:
    anthropic = AnthropicStreamAssembler()
    for name, data in translate_stream(CHUNKS):
        anthropic.feed(name, data)
    openai = OpenAIStreamAssembler()
    for c in CHUNKS:
        openai.feed(c)
    expected = openai_response_to_anthropic(openai.result(), "claude-x")
    assert anthropic.result() == expected
    assert expected["content"][0] == {"type": "text", "text": "Let me check."}
    assert [b["input"] for b in expected["content"][1:]] == [{"city": "Paris"}, {"city": "Rome"}]
    Message.model_validate(anthropic.result())


def test_text_after_a_tool_call_opens_a_new_block() -> None:
    chunks = [
        chunk({"content": "a"}),
        chunk(tool_delta(0, "{}", "c", "f")),
        chunk({"content": "b"}),
        chunk({}, "stop"),
    ]
    assembler = AnthropicStreamAssembler()
    for name, data in translate_stream(chunks):
        assembler.feed(name, data)
    content = assembler.result()["content"]
    assert [block["type"] for block in content] == ["text", "tool_use", "text"]
    assert content[2]["text"] == "b"


def test_a_stream_of_only_a_finish_still_forms_a_message() -> None:
    stream = OpenAIToAnthropicStream("m")
    events = stream.feed(chunk({}, "stop")) + stream.finish()
    assert [name for name, _ in events] == ["message_start", "message_delta", "message_stop"]
    assert events[1][1]["delta"]["stop_reason"] == "end_turn"
    assert stream.finish() == []


@pytest.mark.parametrize("chunks", [[], [chunk({"content": "cut sh"})]], ids=["empty", "cut"])
def test_a_stream_without_a_finish_reason_gets_no_invented_stop(
    chunks: list[dict[str, Any]],
) -> None:
    stream = OpenAIToAnthropicStream("m")
    for c in chunks:
        stream.feed(c)
    assert stream.stop_reason is None
    with pytest.raises(UpstreamTruncatedError):
        stream.finish()


def test_a_response_without_a_finish_reason_gets_no_invented_stop() -> None:
    resp = openai_response()
    resp["choices"][0]["finish_reason"] = None
    assert openai_response_to_anthropic(resp, "m")["stop_reason"] is None

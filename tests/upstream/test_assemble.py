"""Reassembling streams into the complete responses that get recorded."""

from __future__ import annotations

from typing import Any

from anthropic.types import Message
from openai.types.chat import ChatCompletion

from reef.upstream.assemble import AnthropicStreamAssembler, OpenAIStreamAssembler
from reef.upstream.translate import RAW_ARGUMENTS_KEY


def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 9,
        "model": "m",
        "system_fingerprint": "fp",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    }


def test_openai_choices_tool_calls_and_usage() -> None:
    assembler = OpenAIStreamAssembler()
    for c in [
        chunk(0, {"role": "assistant", "content": ""}),
        chunk(1, {"role": "assistant", "content": "B"}),
        chunk(0, {"content": "A1 "}),
        chunk(
            0,
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_x",
                        "type": "function",
                        "function": {"name": "f", "arguments": ""},
                    }
                ]
            },
        ),
        chunk(0, {"tool_calls": [{"index": 0, "function": {"arguments": '{"k":'}}]}),
        chunk(0, {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
        chunk(0, {"content": "A2"}),
        chunk(1, {}, "length"),
        chunk(0, {}, "tool_calls"),
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 9,
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        },
    ]:
        assembler.feed(c)
    result = assembler.result()
    assert result == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 9,
        "model": "m",
        "system_fingerprint": "fp",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "A1 A2",
                    "tool_calls": [
                        {
                            "id": "call_x",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"k": 1}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
                "logprobs": None,
            },
            {
                "index": 1,
                "message": {"role": "assistant", "content": "B"},
                "finish_reason": "length",
                "logprobs": None,
            },
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
    ChatCompletion.model_validate(result)


def test_openai_without_usage_and_cut_short() -> None:
    assembler = OpenAIStreamAssembler()
    assembler.feed(chunk(0, {"role": "assistant", "content": "partial"}))
    result = assembler.result()
    assert "usage" not in result
    assert result["choices"][0]["finish_reason"] is None
    assert result["choices"][0]["message"]["content"] == "partial"


def test_openai_tool_only_message_has_null_content() -> None:
    assembler = OpenAIStreamAssembler()
    assembler.feed(
        chunk(
            0,
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ]
            },
        )
    )
    assert assembler.result()["choices"][0]["message"]["content"] is None


ANTHROPIC_EVENTS: list[tuple[str, dict[str, Any]]] = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 25, "output_tokens": 1, "cache_read_input_tokens": 4},
            },
        },
    ),
    ("ping", {"type": "ping"}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": ""},
        },
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "hmm"},
        },
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "sig"},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hel"}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "lo"}},
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
        },
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"a": '},
        },
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": "[1, 2]}"},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 2}),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 15},
        },
    ),
    ("message_stop", {"type": "message_stop"}),
]


def test_anthropic_blocks_and_usage_merge() -> None:
    assembler = AnthropicStreamAssembler()
    for name, data in ANTHROPIC_EVENTS:
        assembler.feed(name, data)
    result = assembler.result()
    assert result == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "Hello"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1, 2]}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 25, "output_tokens": 15, "cache_read_input_tokens": 4},
    }
    Message.model_validate(result)
    assert assembler.error is None


def test_anthropic_invalid_partial_json_is_kept_raw() -> None:
    assembler = AnthropicStreamAssembler()
    for name, data in ANTHROPIC_EVENTS[:12]:  # cut off inside the tool input
        assembler.feed(name, data)
    assembler.feed(
        "error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    )
    result = assembler.result()
    assert result["content"][2]["input"] == {RAW_ARGUMENTS_KEY: '{"a": '}
    assert result["stop_reason"] is None
    assert assembler.error == {"type": "overloaded_error", "message": "busy"}


def test_anthropic_tool_without_deltas_keeps_its_start_input() -> None:
    assembler = AnthropicStreamAssembler()
    assembler.feed(
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        },
    )
    assert assembler.result()["content"][0]["input"] == {}


def test_anthropic_text_and_thinking_deltas_join_in_order_and_a_restart_resets() -> None:
    assembler = AnthropicStreamAssembler()
    start = {"type": "content_block_start", "index": 0}
    assembler.feed("content_block_start", {**start, "content_block": {"type": "text", "text": ">"}})
    for piece in ("a", "b", "c"):
        delta = {"type": "text_delta", "text": piece}
        assembler.feed("content_block_delta", {"index": 0, "delta": delta})
        thought = {"type": "thinking_delta", "thinking": piece.upper()}
        assembler.feed("content_block_delta", {"index": 1, "delta": thought})
    assert assembler.result()["content"][0]["text"] == ">abc"
    assert assembler.result()["content"][1]["thinking"] == "ABC"
    assembler.feed("content_block_start", {**start, "content_block": {"type": "text", "text": ""}})
    assert assembler.result()["content"][0]["text"] == ""

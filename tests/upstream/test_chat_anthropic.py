"""Chat requests → Anthropic Messages, and Anthropic answers and events → chat, the
path a Responses request takes to an Anthropic upstream."""

from __future__ import annotations

import orjson

from reef.upstream import (
    RAW_ARGUMENTS_KEY,
    AnthropicToOpenAIStream,
    anthropic_response_to_openai,
    openai_request_to_anthropic,
    openai_response_to_responses,
    response_shell,
    responses_request_to_openai,
)


def test_a_conversation_becomes_alternating_turns_with_one_system() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use metric."}]},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "function": {"name": "w", "arguments": '{"city": "Paris"}'}},
                    {"id": "c2", "function": {"name": "w", "arguments": "not json"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "rain"},
            {"role": "user", "content": "And tomorrow?"},
        ],
        "max_completion_tokens": 20,
        "stop": "END",
        "user": "u-1",
        "top_p": 0.5,
    }
    out = openai_request_to_anthropic(chat, "claude-x")
    assert out["system"] == "Be brief.\n\nUse metric."
    assert out["max_tokens"] == 20 and out["stop_sequences"] == ["END"]
    assert out["metadata"] == {"user_id": "u-1"} and out["top_p"] == 0.5
    roles = [turn["role"] for turn in out["messages"]]
    assert roles == ["user", "assistant", "user"]
    calls = out["messages"][1]["content"]
    assert calls[0]["input"] == {"city": "Paris"}
    assert calls[1]["input"] == {RAW_ARGUMENTS_KEY: "not json"}  # nothing lost
    assert out["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "c1", "content": "sunny"},
        {"type": "tool_result", "tool_use_id": "c2", "content": "rain"},
        {"type": "text", "text": "And tomorrow?"},
    ]


def test_images_tools_and_tool_choice() -> None:
    body = {
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                    {"type": "input_image", "image_url": "https://example.org/a.png"},
                ],
            }
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "parallel_tool_calls": False,
    }
    out = openai_request_to_anthropic(responses_request_to_openai(body, ""), "m")
    assert out["messages"][0]["content"][1:] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.org/a.png"}},
    ]
    assert out["tools"] == [{"name": "f", "input_schema": {"type": "object"}}]
    assert out["tool_choice"] == {"type": "tool", "name": "f", "disable_parallel_tool_use": True}
    for choice, expected in (("required", "any"), ("none", "none"), ("auto", "auto")):
        sent = openai_request_to_anthropic(
            responses_request_to_openai({**body, "tool_choice": choice}, ""), "m"
        )
        assert sent["tool_choice"]["type"] == expected


def test_a_refusal_is_an_incomplete_response() -> None:
    message = {
        "id": "msg_1",
        "model": "claude-x",
        "content": [{"type": "text", "text": "I can't help with that."}],
        "stop_reason": "refusal",
        "usage": {"input_tokens": 5, "output_tokens": 6, "cache_read_input_tokens": 10},
    }
    chat = anthropic_response_to_openai(message)
    assert chat["choices"][0]["finish_reason"] == "content_filter"
    assert chat["usage"] == {
        "prompt_tokens": 15,
        "completion_tokens": 6,
        "total_tokens": 21,
        "prompt_tokens_details": {"cached_tokens": 10},
    }
    response = openai_response_to_responses(chat, response_shell({}, "resp_1", "m", 0))
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "content_filter"}
    assert response["usage"]["input_tokens_details"] == {"cached_tokens": 10}


def test_tool_use_and_thinking_blocks_of_an_answer() -> None:
    message = {
        "id": "msg_2",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Rome"}},
        ],
        "stop_reason": "tool_use",
    }
    reply = anthropic_response_to_openai(message)["choices"][0]
    assert reply["finish_reason"] == "tool_calls"
    assert reply["message"]["content"] == "Checking."
    call = reply["message"]["tool_calls"][0]
    assert call["id"] == "toolu_1" and orjson.loads(call["function"]["arguments"]) == {
        "city": "Rome"
    }


def test_a_tool_use_sent_whole_at_its_start_is_its_arguments() -> None:
    stream = AnthropicToOpenAIStream()
    block = {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Rome"}}
    chunks = stream.feed(
        "content_block_start", {"type": "content_block_start", "index": 1, "content_block": block}
    )
    calls = [chunk["choices"][0]["delta"]["tool_calls"][0] for chunk in chunks]
    assert calls[0]["id"] == "toolu_1" and calls[0]["index"] == 0
    assert orjson.loads(calls[1]["function"]["arguments"]) == {"city": "Rome"}

"""The canonical conversation form and its prefix hashes."""

from __future__ import annotations

from typing import Any

from anthropic.types import Message
from openai.types.chat import ChatCompletion

from reef.upstream.canonical import (
    canonical_anthropic,
    canonical_openai,
    canonical_reply_anthropic,
    canonical_reply_openai,
    chain_hashes,
)

OPENAI_REPLY: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "weather",
                            "arguments": '{ "unit": "C",  "city": "Paris" }',
                        },
                    }
                ],
            },
        }
    ],
}


def test_an_openai_reply_resent_by_the_sdk_is_the_same_message() -> None:
    # What the OpenAI SDK sends back: the parsed message dumped, with its null extras.
    resent = ChatCompletion.model_validate(OPENAI_REPLY).choices[0].message.model_dump()
    assert "refusal" in resent
    body = {
        "messages": [
            {"role": "user", "content": "weather?"},
            resent,
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
    }
    canonical = canonical_openai(body)
    assert canonical[1] == canonical_reply_openai(OPENAI_REPLY)
    assert canonical[1] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "call_1", "name": "weather", "arguments": '{"city":"Paris","unit":"C"}'}
        ],
    }
    assert canonical[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


def test_an_anthropic_reply_resent_by_the_sdk_is_the_same_message() -> None:
    reply = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 2},
    }
    resent = Message.model_validate(reply).model_dump()["content"]
    body = {
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": resent},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
            },
        ],
    }
    canonical = canonical_anthropic(body)
    assert canonical[0] == {"role": "system", "content": "Be brief."}
    assert canonical[1] == {"role": "user", "content": "weather?"}
    assert canonical[2] == canonical_reply_anthropic(reply)
    assert canonical[3] == {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"}


def test_plain_string_and_text_parts_are_equal_and_images_are_described() -> None:
    as_string = canonical_openai({"messages": [{"role": "user", "content": "hi"}]})
    as_parts = canonical_openai(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    )
    assert as_string == as_parts
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}
    [message] = canonical_openai(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]}
    )
    assert message["content"].startswith("see\n[image_url sha256:")
    [again] = canonical_openai(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]}
    )
    assert again == message


def test_empty_fields_are_dropped() -> None:
    [message] = canonical_openai(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [],
                    "name": None,
                    "refusal": None,
                }
            ]
        }
    )
    assert message == {"role": "assistant"}


def test_chain_hashes_cover_every_prefix() -> None:
    a = {"role": "user", "content": "a"}
    b = {"content": "b", "role": "assistant"}  # key order does not matter
    c = {"role": "user", "content": "c"}
    full = chain_hashes([a, b, c])
    assert len(full) == 3
    assert chain_hashes([a, b]) == full[:2]
    assert chain_hashes([a, dict(reversed(list(b.items())))])[1] == full[1]
    assert chain_hashes([a, {"role": "assistant", "content": "B"}])[1] != full[1]
    assert chain_hashes([c, b])[1] != full[1]  # a hash depends on everything before it
    assert chain_hashes([]) == []

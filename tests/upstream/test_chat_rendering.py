"""``openai_chat_messages``: canonical messages back in OpenAI chat form, the way back of
``canonical_openai``. The property: every canonical conversation renders to messages
that read back as itself. Conversations come from the three dialects (canonicalised by
the gateway's own translators) and from a seeded generator of canonical shapes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from reef.core.jsoncodec import dumps
from reef.gateway.body_checks import check_messages
from reef.upstream.canonical import (
    canonical_anthropic,
    canonical_openai,
    canonical_responses,
    openai_chat_message,
    openai_chat_messages,
)

IMAGE = "data:image/png;base64,iVBORw0KGgo="
WEATHER_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
ROME_CALL = {
    "id": "call_2",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
}

OPENAI_CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "text": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    "tool-call-content-null": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ],
    "parallel-calls": [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking both.", "tool_calls": [WEATHER_CALL, ROME_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
        {"role": "assistant", "content": "Sunny in Paris, rain in Rome."},
        {"role": "user", "content": "thanks"},
    ],
    "image-parts": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": IMAGE}},
            ],
        }
    ],
    "sdk-extras": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "refusal": None, "annotations": []},
        {"role": "user", "content": "again", "name": "ann"},
    ],
    "empty-tool-result-and-raw-arguments": [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": ""},
    ],
}

ANTHROPIC_BODIES: dict[str, dict[str, Any]] = {
    "tools-and-error": {
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "w", "input": {"city": "Rome"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "no such city"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
        ],
    },
    "image": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                    },
                    {"type": "text", "text": "what is this?"},
                ],
            }
        ]
    },
}

RESPONSES_BODIES: dict[str, dict[str, Any]] = {
    "function-calls": {
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": "weather in Paris and Rome?"},
            {"type": "function_call", "call_id": "fc_1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "fc_2", "name": "w", "arguments": '{"a":1}'},
            {"type": "function_call_output", "call_id": "fc_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "fc_2", "output": "rain"},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "and this?"},
                    {"type": "input_image", "image_url": IMAGE, "detail": "low"},
                ],
            },
        ],
    },
    "text-input": {"input": "hello"},
}


def _dialect_cases() -> list[Any]:
    cases = [
        pytest.param(canonical_openai({"messages": m}), id=f"openai-{name}")
        for name, m in OPENAI_CONVERSATIONS.items()
    ]
    cases += [
        pytest.param(canonical_anthropic(body), id=f"anthropic-{name}")
        for name, body in ANTHROPIC_BODIES.items()
    ]
    cases += [
        pytest.param(canonical_responses(body), id=f"responses-{name}")
        for name, body in RESPONSES_BODIES.items()
    ]
    return cases


def _generated(seed: int) -> list[dict[str, Any]]:
    """A random canonical conversation: any roles in any order, text or not, tool
    calls with or without id, name and arguments, tool results with or without text."""
    rng = random.Random(seed)
    texts = ["", "hi", "two words", "[image_url sha256:0123456789abcdef]", "line\nbreak"]
    arguments = ["", "{}", dumps({"city": "Paris", "n": 2}).decode(), "not json", "[1,2]"]
    messages: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 6)):
        role = rng.choice(["system", "user", "assistant", "tool"])
        message: dict[str, Any] = {"role": role, "content": rng.choice(texts)}
        if role == "assistant" and rng.random() < 0.6:
            message["tool_calls"] = [
                {
                    "id": rng.choice(["", f"call_{index}"]),
                    "name": rng.choice(["", "get_weather"]),
                    "arguments": rng.choice(arguments),
                }
                for index in range(rng.randint(1, 3))
            ]
        if role == "tool":
            message["tool_call_id"] = rng.choice(["", "call_0"])
        if role == "user" and rng.random() < 0.2:
            message["name"] = "ann"
        messages.append(message)
    # What canonical_message keeps of it: the canonical conversation itself.
    return canonical_openai({"messages": openai_chat_messages(messages)})


@pytest.mark.parametrize("canonical", _dialect_cases())
def test_canonical_conversations_of_every_dialect_read_back_as_themselves(
    canonical: list[dict[str, Any]],
) -> None:
    rendered = openai_chat_messages(canonical)
    assert canonical_openai({"messages": rendered}) == canonical
    _assert_openai_form(rendered)


@pytest.mark.parametrize("seed", range(200))
def test_generated_canonical_conversations_read_back_as_themselves(seed: int) -> None:
    canonical = _generated(seed)
    rendered = openai_chat_messages(canonical)
    assert canonical_openai({"messages": rendered}) == canonical
    _assert_openai_form(rendered)


@pytest.mark.parametrize("name", sorted(OPENAI_CONVERSATIONS))
def test_openai_form_passes_through_unchanged(name: str) -> None:
    messages = OPENAI_CONVERSATIONS[name]
    assert openai_chat_messages(messages) == messages


def test_flat_tool_calls_are_nested_and_content_null_restored() -> None:
    flat = {
        "role": "assistant",
        "tool_calls": [{"id": "call_1", "name": "lookup_order", "arguments": '{"id":7}'}],
    }
    assert openai_chat_message(flat) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"id":7}'},
            }
        ],
    }
    assert openai_chat_message({"role": "tool", "tool_call_id": "call_1"}) == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "",
    }


def _assert_openai_form(messages: list[dict[str, Any]]) -> None:
    """What the gateway and OpenAI's API require of chat messages: every message has a
    ``content`` key, and every tool call a string id and a function with string name
    and arguments."""
    check_messages({"messages": messages})
    for message in messages:
        assert "content" in message
        content = message["content"]
        assert content is None or isinstance(content, str | list)
        if content is None:
            assert message["role"] == "assistant" and message.get("tool_calls")
        for call in message.get("tool_calls") or ():
            assert isinstance(call["id"], str) and call["type"] == "function"
            assert isinstance(call["function"]["name"], str)
            assert isinstance(call["function"]["arguments"], str)

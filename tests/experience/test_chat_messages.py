"""``chat_messages``: a record's conversation in OpenAI chat form, taken from its own
request (lossless) where that reads back as its canonical conversation, else the
canonical messages rendered back."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from reef.experience import RecordView, canonical_exchange, chat_messages
from reef.upstream.canonical import canonical_openai

DOWN = {"content": "down"}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}


def record(api: str, request: dict[str, Any]) -> RecordView:
    return RecordView(
        id="r1",
        scenario="support",
        session_id="s1",
        turn=0,
        release_id=None,
        api=api,
        request=request,
        response=None,
        status="ok",
        error=None,
        latency_ms=1.0,
        usage=None,
        prompt_hash="h",
        content_hash="c",
        tags={},
        principal=None,
        purpose="serve",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_a_chat_record_keeps_its_own_messages() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, IMAGE]},
        {"role": "assistant", "content": "a cat", "refusal": None},
        {"role": "user", "content": "sure?"},
    ]
    assert chat_messages(record("openai.chat", {"messages": messages})) == messages


def test_an_anthropic_record_is_translated_with_its_tool_error_and_image() -> None:
    request = {
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": "down",
                        "is_error": True,
                    },
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                    },
                ],
            },
        ],
    }
    view = record("anthropic.messages", request)
    chat = chat_messages(view)
    assert chat[0] == {"role": "system", "content": "Be brief."}
    assert chat[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
        ],
    }
    assert chat[3] == {"role": "tool", "tool_call_id": "t1", "content": "[error] down"}
    assert chat[4] == {"role": "user", "content": [IMAGE]}
    assert canonical_openai({"messages": chat}) == canonical_exchange(view).messages


@pytest.mark.parametrize(
    ("api", "request_body"),
    [
        ("openai.completions", {"prompt": "Once upon"}),
        ("openai.embeddings", {"input": ["a", "b"]}),
        # A chat record whose messages are themselves canonical (a client re-sending a
        # stored conversation as it was kept): flat calls render back into chat form.
        (
            "openai.chat",
            {
                "messages": [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "tool_calls": [{"id": "c", "name": "f"}]},
                ]
            },
        ),
    ],
)
def test_other_records_fall_back_to_their_canonical_messages_rendered(
    api: str, request_body: dict[str, Any]
) -> None:
    view = record(api, request_body)
    chat = chat_messages(view)
    assert canonical_openai({"messages": chat}) == canonical_exchange(view).messages
    assert all("content" in message for message in chat)

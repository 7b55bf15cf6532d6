"""The fake model server speaks well enough for the official SDKs (used by gateway tests)."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.fakes.upstream import FakeUpstream, FakeUpstreamThread

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def fake_thread() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread(api_key="sk-fake") as running:
        yield running


def test_openai_sdk_chat_tools_and_stream(fake_thread: FakeUpstreamThread) -> None:
    with openai.OpenAI(base_url=fake_thread.base_url, api_key="sk-fake", max_retries=0) as client:
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello world"}]
        )
        assert reply.choices[0].message.content == "echo: hello world"
        assert fake_thread.last_request_headers["authorization"] == "Bearer sk-fake"
        assert fake_thread.last_request_body["messages"][0]["content"] == "hello world"
        assert fake_thread.last_request_path == "/v1/chat/completions"

        called = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "what is the weather?"}],
            tools=[TOOL],  # type: ignore[list-item]
        )
        call = called.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert called.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, call.function.arguments) == (  # type: ignore[union-attr]
            "get_weather",
            '{"city": "Paris"}',
        )
        answered = client.chat.completions.create(
            model="m",
            messages=[
                {"role": "user", "content": "what is the weather?"},
                called.choices[0].message.model_dump(),  # type: ignore[list-item]
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
            ],
        )
        assert answered.choices[0].message.content == "tool said: sunny"

        chunks = list(
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "a b"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "echo: a b"
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 3
        assert [m.id for m in client.models.list()] == ["fake-model"]


def test_openai_sdk_sees_injected_failures(fake_thread: FakeUpstreamThread) -> None:
    fake_thread.reset()
    with openai.OpenAI(base_url=fake_thread.base_url, api_key="sk-fake", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError, match="fail-500"):
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "please fail-500"}]
            )
        with pytest.raises(openai.BadRequestError, match="bad-request"):
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "bad-request"}]
            )
        with pytest.raises(openai.AuthenticationError):
            client.with_options(api_key="wrong").models.list()
    assert fake_thread.requests_received("/v1/chat/completions") == 2
    assert fake_thread.requests["/v1/models"] == 1
    assert fake_thread.cancelled_streams == fake_thread.completed_streams == 0


async def test_anthropic_sdk_messages_tools_and_stream() -> None:
    fake = FakeUpstream()
    await fake.start()
    client = anthropic.AsyncAnthropic(
        base_url=fake.base_url.removesuffix("/v1"), api_key="k", max_retries=0
    )
    try:
        reply = await client.messages.create(
            model="c", max_tokens=20, messages=[{"role": "user", "content": "hi you"}]
        )
        assert reply.content[0].type == "text"
        assert reply.content[0].text == "echo: hi you"
        assert reply.usage.input_tokens == 2

        tools: list[anthropic.types.ToolParam] = [
            {"name": "get_weather", "input_schema": {"type": "object"}}
        ]
        called = await client.messages.create(
            model="c",
            max_tokens=20,
            tools=tools,
            messages=[{"role": "user", "content": "weather please"}],
        )
        assert called.stop_reason == "tool_use"
        use = called.content[0]
        assert use.type == "tool_use"
        assert use.input == {"city": "Paris"}
        answered = await client.messages.create(
            model="c",
            max_tokens=20,
            tools=tools,
            messages=[
                {"role": "user", "content": "weather please"},
                {"role": "assistant", "content": called.content},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
                },
            ],
        )
        assert answered.content[0].type == "text"
        assert answered.content[0].text == "tool said: sunny"

        async with client.messages.stream(
            model="c",
            max_tokens=20,
            tools=tools,
            messages=[{"role": "user", "content": "weather please"}],
        ) as stream:
            final = await stream.get_final_message()
        assert final.content[0].type == "tool_use"
        assert final.content[0].input == {"city": "Paris"}
        assert fake.requests["/v1/messages"] == 4
        headers = fake.last_request_headers
        assert headers.get("x-api-key") == "k" or headers.get("authorization") == "Bearer k"
    finally:
        await client.close()
        await fake.stop()

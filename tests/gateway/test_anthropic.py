"""The Anthropic dialect through the official SDK, translated to an OpenAI upstream and
passed through to an Anthropic upstream."""

from __future__ import annotations

import anthropic
import pytest

from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}

# "support" runs on the OpenAI-compatible fake; "claude" on the Anthropic-dialect fake.
SCENARIOS = ["support", "claude"]


def client(gateway: GatewayThread, scenario: str) -> anthropic.Anthropic:
    return gateway.anthropic(**{"x-reef-scenario": scenario})


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_message_is_served_and_recorded(
    gateway: GatewayThread, fake: FakeUpstreamThread, scenario: str
) -> None:
    raw = client(gateway, scenario).messages.with_raw_response.create(
        model="claude-anything",
        max_tokens=64,
        system="be terse",
        messages=[{"role": "user", "content": "hello anthropic"}],
    )
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    text = message.content[0].text  # type: ignore[union-attr]
    assert "hello anthropic" in text
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens > 0
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.api == "anthropic.messages"
    assert record.scenario == scenario
    assert record.request["system"] == "be terse"
    assert record.response is not None and record.response["content"][0]["text"] == text
    if scenario == "support":
        # translated: the OpenAI upstream saw a system message and the user turn
        sent = fake.last_request_body
        assert sent["messages"][0] == {"role": "system", "content": "be terse"}
        # the upstream's configured model serves whatever name the client sent
        assert sent["model"] == "fake-model"
        assert record.request["model"] == "claude-anything"
    else:
        assert fake.last_request_headers["x-api-key"] == "anthropic-secret"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_stream_is_served_and_reassembled(gateway: GatewayThread, scenario: str) -> None:
    api = client(gateway, scenario)
    with api.messages.stream(
        model="claude-anything",
        max_tokens=64,
        messages=[{"role": "user", "content": "stream to me"}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        record_id = stream.response.headers["x-reef-record-id"]
    assert "stream to me" in text
    assert final.stop_reason == "end_turn"
    record = gateway.store.get_record(record_id)
    assert record.status == "ok"
    assert record.response is not None
    assert record.response["content"][0]["text"] == text
    assert record.usage is not None and record.usage["output_tokens"] == final.usage.output_tokens


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip(gateway: GatewayThread, scenario: str, stream: bool) -> None:
    api = client(gateway, scenario)
    request = {
        "model": "claude-anything",
        "max_tokens": 64,
        "tools": [WEATHER_TOOL],
        "messages": [{"role": "user", "content": "what is the weather in Paris?"}],
    }
    if stream:
        with api.messages.stream(**request) as events:  # type: ignore[arg-type]
            message = events.get_final_message()
            record_id = events.response.headers["x-reef-record-id"]
    else:
        raw = api.messages.with_raw_response.create(**request)  # type: ignore[arg-type]
        message = raw.parse()
        record_id = raw.headers["x-reef-record-id"]
    assert message.stop_reason == "tool_use"
    tool_use = next(block for block in message.content if block.type == "tool_use")
    assert tool_use.name == "get_weather"
    assert tool_use.input == {"city": "Paris"}
    record = gateway.store.get_record(record_id)
    assert record.response is not None
    recorded = [b for b in record.response["content"] if b["type"] == "tool_use"]
    assert recorded[0]["input"] == {"city": "Paris"}

    # the tool result goes back; the next turn joins the same session
    follow = api.messages.with_raw_response.create(
        model="claude-anything",
        max_tokens=64,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": "what is the weather in Paris?"},
            {"role": "assistant", "content": [b.model_dump() for b in message.content]},  # type: ignore[misc]
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny"}
                ],
            },
        ],
    )
    assert "sunny" in follow.parse().content[0].text  # type: ignore[union-attr]
    assert follow.headers["x-reef-session-id"] == record.session_id
    assert gateway.store.get_record(follow.headers["x-reef-record-id"]).turn == 1


def test_openai_route_on_anthropic_upstream_is_refused_clearly(gateway: GatewayThread) -> None:
    import openai

    api = gateway.openai()
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(
            model="reef/claude", messages=[{"role": "user", "content": "hi"}]
        )
    assert "/v1/messages" in str(info.value)

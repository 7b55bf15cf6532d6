"""The OpenAI Responses API through the official SDK on an Anthropic upstream (the
fake's ``/v1/messages``): answers, streams, a function tool round trip over
``previous_response_id``, what cannot be translated refused; records in the canonical
form of the other dialects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from reef.experience import RecordView, canonical_exchange
from reef.harness import Bundle, Harness, write_bundle
from reef.upstream import response_shell
from reef.upstream.responses.relay import AnthropicResponsesRelay
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread
from tests.gateway.test_responses import WEATHER_TOOL
from tests.gateway.test_responses_native import HARNESS_TOOL

# "claude" is the scenario the test settings serve from the Anthropic-dialect fake.
MODEL = "reef/claude"


def _record(gateway: GatewayThread, headers: Any) -> RecordView:
    return gateway.store.get_record(headers["x-reef-record-id"])


def test_a_plain_response_is_sent_as_messages_and_recorded(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    raw = gateway.openai().responses.with_raw_response.create(
        model=MODEL,
        input="hello there",
        instructions="Answer briefly.",
        temperature=0.2,
        max_output_tokens=50,
        metadata={"team": "blue"},
    )
    response = raw.parse()
    assert response.status == "completed" and response.output_text == "echo: hello there"
    assert response.id.startswith("resp_") and response.model == MODEL
    assert response.usage is not None and response.usage.input_tokens == 4  # system words too
    assert response.usage.output_tokens == 3 and response.usage.total_tokens == 7
    assert fake.last_request_path == "/v1/messages"
    assert fake.last_request_headers["x-api-key"] == "anthropic-secret"
    assert fake.last_request_body == {
        "model": "fake-claude",
        "max_tokens": 50,
        "system": "Answer briefly.",
        "temperature": 0.2,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
    }
    record = _record(gateway, raw.headers)
    assert record.api == "openai.responses" and record.status == "ok"
    assert record.scenario == "claude" and record.request["input"] == "hello there"
    assert record.response is not None and record.response["id"] == response.id
    exchange = canonical_exchange(record)  # the same form as the other dialects'
    assert exchange.messages == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "hello there"},
    ]
    assert exchange.reply == {"role": "assistant", "content": "echo: hello there"}
    assert gateway.openai().responses.retrieve(response.id).output_text == "echo: hello there"


def test_without_max_output_tokens_the_default_is_sent(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    gateway.openai().responses.create(model=MODEL, input="hi")
    assert fake.last_request_body["max_tokens"] == 4096  # Messages requires one
    assert "system" not in fake.last_request_body


def test_a_stream_is_the_typed_event_sequence(gateway: GatewayThread) -> None:
    raw = gateway.openai().responses.with_raw_response.create(
        model=MODEL, input="stream me please", stream=True
    )
    events = list(raw.parse())
    kinds = [event.type for event in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "echo: stream me please"
    final = events[-1]
    assert final.type == "response.completed" and final.response.output_text == deltas
    assert final.response.usage is not None and final.response.usage.output_tokens == 4
    assert final.x_reef["record_id"] == raw.headers["x-reef-record-id"]
    record = _record(gateway, raw.headers)
    assert record.status == "ok" and record.response is not None
    assert record.response["id"] == final.response.id and "x_reef" not in record.response
    assert canonical_exchange(record).reply == {"role": "assistant", "content": deltas}
    assert gateway.openai().responses.retrieve(final.response.id).output_text == deltas


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_function_tool_round_trip_through_previous_response_id(
    gateway: GatewayThread, fake: FakeUpstreamThread, stream: bool
) -> None:
    client = gateway.openai()
    first_raw = client.responses.with_raw_response.create(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER_TOOL]
    )
    first = first_raw.parse()
    assert fake.last_request_body["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": WEATHER_TOOL["parameters"],
        }
    ]
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].call_id.startswith("toolu_fake")  # the tool_use id, kept
    assert orjson.loads(calls[0].arguments) == {"city": "Paris"}
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}
    with client.responses.with_streaming_response.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[output],
        tools=[WEATHER_TOOL],
        stream=stream,
    ) as second_raw:
        if stream:
            events = list(second_raw.parse())
            assert events[-1].type == "response.completed"
            second = events[-1].response
        else:
            second = second_raw.parse()
        second_headers = second_raw.headers
    assert second.output_text == "tool said: sunny"
    assert second.previous_response_id == first.id
    # Anthropic saw the whole conversation: question, tool_use, tool_result
    assert fake.last_request_body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": calls[0].call_id,
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": calls[0].call_id, "content": "sunny"}
            ],
        },
    ]
    one, two = _record(gateway, first_raw.headers), _record(gateway, second_headers)
    assert two.session_id == one.session_id and (one.turn, two.turn) == (0, 1)
    exchange = canonical_exchange(two)
    assert exchange.messages[1]["tool_calls"][0]["name"] == "get_weather"
    assert exchange.messages[2] == {
        "role": "tool",
        "tool_call_id": calls[0].call_id,
        "content": "sunny",
    }
    assert exchange.reply == {"role": "assistant", "content": "tool said: sunny"}


def test_a_streamed_function_call(gateway: GatewayThread) -> None:
    events = list(
        gateway.openai().responses.create(
            model=MODEL, input="weather in Paris?", tools=[WEATHER_TOOL], stream=True
        )
    )
    kinds = [event.type for event in events]
    assert kinds.count("response.function_call_arguments.delta") == 2  # the fake's two pieces
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and orjson.loads(done[0].arguments) == {"city": "Paris"}
    final = events[-1]
    assert final.type == "response.completed"
    call = final.response.output[-1]
    assert call.type == "function_call" and call.call_id.startswith("toolu_fake")


@pytest.mark.parametrize(
    ("extra", "param", "named"),
    [
        (
            {"input": "hi", "text": {"format": {"type": "json_object"}}},
            "text.format.type",
            "'json_object'",
        ),
        ({"input": "hi", "reasoning": {"effort": "low"}}, "reasoning.effort", "thinking"),
        ({"input": "hi", "temperature": 1.5}, "temperature", "at most 1"),
        (
            {"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]},
            "input[0].type",
            "'reasoning'",
        ),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type", "'web_search'"),
    ],
    ids=["json-format", "reasoning-effort", "temperature", "reasoning-item", "built-in-tool"],
)
def test_what_anthropic_cannot_do_is_refused_naming_it(
    module_gateway: GatewayThread,
    fake: FakeUpstreamThread,
    extra: dict[str, Any],
    param: str,
    named: str,
) -> None:
    before = module_gateway.writer_stats.written_total
    sent = fake.requests_received("/v1/messages")
    with pytest.raises(openai.BadRequestError) as info:
        module_gateway.openai().responses.create(model=MODEL, extra_body=extra)
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param and named in body["message"]
    assert fake.requests_received("/v1/messages") == sent  # never reached the upstream
    assert module_gateway.writer_stats.written_total == before


def test_an_upstream_error_event_mid_stream_is_response_failed(gateway: GatewayThread) -> None:
    raw = gateway.openai().responses.with_raw_response.create(
        model=MODEL, input="please error-mid-stream now", stream=True
    )
    events = list(raw.parse())
    assert events[0].type == "response.created"
    final = events[-1]
    assert final.type == "response.failed" and final.response.status == "failed"
    assert final.response.error is not None
    assert "overloaded_error" in final.response.error.message
    record = _record(gateway, raw.headers)
    assert record.status == "error" and record.error is not None
    assert "error-mid-stream" in record.error
    with pytest.raises(openai.NotFoundError):  # a failed response is not kept
        gateway.openai().responses.retrieve(final.response.id)


def test_an_upstream_refusal_of_the_request_is_an_openai_error(gateway: GatewayThread) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        gateway.openai().responses.create(model=MODEL, input="please bad-request now")
    body = info.value.body
    assert isinstance(body, dict) and "bad-request" in body["message"]


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(
        b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
        for name, data in events
    )


def test_a_stream_ending_in_max_tokens_is_response_incomplete() -> None:
    relay = AnthropicResponsesRelay(response_shell({"input": "x"}, "resp_1", "m", 0))
    start = {"id": "msg_1", "model": "m", "usage": {"input_tokens": 3, "output_tokens": 1}}
    out = relay.feed(
        _sse(
            [
                ("message_start", {"type": "message_start", "message": start}),
                ("ping", {"type": "ping"}),
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
                ),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": "Once upon"},
                    },
                ),
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": "max_tokens"},
                        "usage": {"output_tokens": 2},
                    },
                ),
                ("message_stop", {"type": "message_stop"}),
            ]
        )
    )
    assert b"response.output_text.delta" in out
    relay.finish()
    response, reply = relay.result()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["output_tokens"] == 2 and response["usage"]["input_tokens"] == 3
    assert reply == {"role": "assistant", "content": "Once upon"}
    assert b"response.incomplete" in relay.terminal


def test_a_managed_harness_renders_into_the_messages_request(
    make_gateway: Any, fake: FakeUpstreamThread, tmp_path: Path
) -> None:
    bundle = tmp_path / "harness"
    harness = Harness(schema_version=1, system_prompt="You triage tickets.", tools=[HARNESS_TOOL])
    write_bundle(Bundle(harness=harness, files={}), bundle)
    gateway = make_gateway(
        scenarios={"agent": {"upstream": "claude", "harness": "managed", "initial_harness": bundle}}
    )
    raw = gateway.openai().responses.with_raw_response.create(
        model="reef/agent", input="hello", instructions="Be brief."
    )
    assert raw.parse().output_text == "echo: hello"
    sent = fake.last_request_body
    assert fake.last_request_path == "/v1/messages"
    assert sent["system"] == "You triage tickets.\n\nBe brief."
    assert [tool["name"] for tool in sent["tools"]] == ["lookup_ticket"]
    record = _record(gateway, raw.headers)
    assert record.request == {"model": "reef/agent", "input": "hello", "instructions": "Be brief."}
    assert record.rendered_request is not None  # the rendered chat form
    assert record.rendered_request["messages"][0] == {
        "role": "system",
        "content": "You triage tickets.\n\nBe brief.",
    }

"""The Responses API passed through to an upstream that speaks it
(``upstreams.<u>.responses: native``), through the official SDK: answers, streams, a
function tool round trip; conversation state and ids stay Reef's, records share the
canonical form of translated ones."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from reef.config.models import UpstreamConfig
from reef.experience import RecordView, canonical_exchange
from reef.harness import Bundle, Example, Harness, write_bundle
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread
from tests.gateway.test_responses import WEATHER_TOOL


@pytest.fixture
def native(make_gateway: Callable[..., GatewayThread], fake: FakeUpstreamThread) -> GatewayThread:
    upstream = {
        "type": "openai",
        "base_url": fake.base_url,
        "model": "fake-model",
        "responses": "native",
        "read_timeout_seconds": 2,
        "total_timeout_seconds": 5,
    }
    return make_gateway(upstreams={"native": upstream}, scenarios={"agent": {}})


def _record(gateway: GatewayThread, headers: Any) -> RecordView:
    return gateway.store.get_record(headers["x-reef-record-id"])


def test_a_plain_response_is_passed_through_under_reefs_id(
    native: GatewayThread, fake: FakeUpstreamThread
) -> None:
    raw = native.openai().responses.with_raw_response.create(
        model="reef/agent", input="hello there", instructions="Be brief.", temperature=0.3
    )
    response = raw.parse()
    assert response.output_text == "echo: hello there"
    assert fake.last_request_path == "/v1/responses"  # not /chat/completions
    assert fake.last_request_body == {
        "model": "fake-model",
        "input": "hello there",
        "instructions": "Be brief.",
        "temperature": 0.3,
    }
    assert response.id.startswith("resp_") and not response.id.startswith("resp_fake")
    assert response.model == "fake-model"  # the upstream's own answer, passed through
    record = _record(native, raw.headers)
    assert record.api == "openai.responses" and record.status == "ok"
    assert record.response is not None and record.response["id"] == response.id
    exchange = canonical_exchange(record)  # the same form as a translated record's
    assert exchange.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
    ]
    assert exchange.reply == {"role": "assistant", "content": "echo: hello there"}
    assert native.openai().responses.retrieve(response.id).output_text == "echo: hello there"


def test_a_stream_is_passed_through_with_the_receipt_at_its_end(
    native: GatewayThread,
) -> None:
    raw = native.openai().responses.with_raw_response.create(
        model="reef/agent", input="stream me please", stream=True
    )
    events = list(raw.parse())
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "echo: stream me please"
    final = events[-1]
    assert final.response.id == events[0].response.id  # Reef's id, in every event
    assert not final.response.id.startswith("resp_fake")
    assert final.x_reef["record_id"] == raw.headers["x-reef-record-id"]
    record = _record(native, raw.headers)
    assert record.status == "ok" and record.response is not None
    assert record.response["id"] == final.response.id and "x_reef" not in record.response
    assert canonical_exchange(record).reply == {"role": "assistant", "content": deltas}


def test_a_function_tool_round_trip_keeps_the_state_in_reef(
    native: GatewayThread, fake: FakeUpstreamThread
) -> None:
    client = native.openai()
    first_raw = client.responses.with_raw_response.create(
        model="reef/agent", input="What is the weather in Paris?", tools=[WEATHER_TOOL]
    )
    first = first_raw.parse()
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].arguments == '{"city": "Paris"}'
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}
    with client.responses.with_streaming_response.create(
        model="reef/agent",
        previous_response_id=first.id,
        input=[output],
        tools=[WEATHER_TOOL],
        stream=True,
    ) as second_raw:
        events = list(second_raw.parse())
        second_headers = second_raw.headers
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "tool said: sunny"
    # the upstream keeps nothing: it got the whole conversation, no previous_response_id
    sent = fake.last_request_body
    assert "previous_response_id" not in sent
    assert [item["type"] for item in sent["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    one, two = _record(native, first_raw.headers), _record(native, second_headers)
    assert two.session_id == one.session_id and (one.turn, two.turn) == (0, 1)
    exchange = canonical_exchange(two)
    assert exchange.messages[1]["tool_calls"][0]["name"] == "get_weather"
    assert exchange.messages[2] == {
        "role": "tool",
        "tool_call_id": calls[0].call_id,
        "content": "sunny",
    }
    assert exchange.reply == {"role": "assistant", "content": "tool said: sunny"}


def test_the_upstreams_own_failure_mid_stream_is_response_failed(native: GatewayThread) -> None:
    raw = native.openai().responses.with_raw_response.create(
        model="reef/agent", input="please error-mid-stream now", stream=True
    )
    events = list(raw.parse())
    assert events[0].type == "response.created"
    final = events[-1]
    assert final.type == "response.failed" and final.response.status == "failed"
    assert final.response.error is not None
    assert "fake upstream overloaded" in final.response.error.message
    assert final.x_reef["record_id"] == raw.headers["x-reef-record-id"]
    record = _record(native, raw.headers)
    assert record.status == "error" and record.error is not None
    assert "fake upstream overloaded" in record.error
    assert record.response is not None and record.response["status"] == "failed"


def test_native_responses_need_an_openai_upstream() -> None:
    with pytest.raises(ValidationError, match="responses: native needs an upstream"):
        UpstreamConfig(type="anthropic", base_url="http://127.0.0.1:1", responses="native")


def test_an_idempotent_retry_of_a_passed_through_stream_is_replayed_from_its_record(
    native: GatewayThread, fake: FakeUpstreamThread
) -> None:
    client = native.openai(**{"x-reef-idempotency-key": "native-1"})
    before = fake.requests_received("/v1/responses")
    runs = []
    for _ in range(2):
        with client.responses.with_streaming_response.create(
            model="reef/agent", input="say it twice", stream=True
        ) as raw:
            runs.append((raw.headers["x-reef-record-id"], list(raw.parse())))
    assert fake.requests_received("/v1/responses") == before + 1
    (first_id, first), (second_id, second) = runs
    assert first_id == second_id
    assert first[-1].type == second[-1].type == "response.completed"
    assert first[-1].response.id == second[-1].response.id
    assert second[-1].response.output_text == "echo: say it twice"
    assert second[-1].x_reef["record_id"] == first_id


HARNESS_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_ticket",
        "description": "A ticket by id",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
    },
}


def test_a_managed_harness_renders_into_the_passed_through_request(
    make_gateway: Callable[..., GatewayThread], fake: FakeUpstreamThread, tmp_path: Path
) -> None:
    harness = Harness(
        schema_version=1,
        system_prompt="You triage tickets.",
        examples=[
            Example(
                messages=[
                    {"role": "user", "content": "Ticket 7?"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_ex",
                                "type": "function",
                                "function": {"name": "lookup_ticket", "arguments": '{"id": "7"}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_ex", "content": "printer jam"},
                    {"role": "assistant", "content": "Ticket 7 is a printer jam."},
                ]
            )
        ],
        tools=[HARNESS_TOOL],
        params={"max_tokens": 64, "seed": 1},
    )
    bundle = tmp_path / "harness"
    write_bundle(Bundle(harness=harness, files={}), bundle)
    upstream = {
        "type": "openai",
        "base_url": fake.base_url,
        "model": "fake-model",
        "responses": "native",
    }
    gateway = make_gateway(
        upstreams={"native": upstream},
        scenarios={"agent": {"harness": "managed", "initial_harness": bundle}},
    )
    client = gateway.openai()
    first_raw = client.responses.with_raw_response.create(
        model="reef/agent", input="hello", instructions="Be brief.", tools=[WEATHER_TOOL]
    )
    first = first_raw.parse()
    assert first.output_text == "echo: hello"
    sent = fake.last_request_body
    assert fake.last_request_path == "/v1/responses"
    assert sent["instructions"] == "You triage tickets.\n\nBe brief."
    assert sent["input"] == [
        {"type": "message", "role": "user", "content": "Ticket 7?"},
        {
            "type": "function_call",
            "call_id": "call_ex",
            "name": "lookup_ticket",
            "arguments": '{"id": "7"}',
        },
        {"type": "function_call_output", "call_id": "call_ex", "output": "printer jam"},
        {"type": "message", "role": "assistant", "content": "Ticket 7 is a printer jam."},
        {"type": "message", "role": "user", "content": "hello"},
    ]
    assert [tool["name"] for tool in sent["tools"]] == ["get_weather", "lookup_ticket"]
    assert sent["tools"][1] == {
        "type": "function",
        "name": "lookup_ticket",
        "description": "A ticket by id",
        "parameters": HARNESS_TOOL["function"]["parameters"],
    }
    assert sent["max_output_tokens"] == 64 and "seed" not in sent  # no Responses seed
    record = _record(gateway, first_raw.headers)
    assert (
        record.release_id is not None
        and record.release_id == first_raw.headers["x-reef-release-id"]
    )
    # the record keeps the client's request, and what went upstream beside it
    assert record.request == {
        "model": "reef/agent",
        "input": "hello",
        "instructions": "Be brief.",
        "tools": [WEATHER_TOOL],
    }
    assert record.rendered_request == {**sent, "model": "reef/agent"}
    # the canonical exchange is the client's conversation, not the harness's
    assert canonical_exchange(record).messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ]
    # a continued response: the demos still come first, then the stored conversation
    client.responses.create(model="reef/agent", previous_response_id=first.id, input="again")
    items = fake.last_request_body["input"]
    assert items[:4] == sent["input"][:4]  # the demos
    assert [item["type"] for item in items[4:]] == ["message", "message", "message"]
    assert items[4]["content"] == [{"type": "input_text", "text": "hello"}]  # as stored
    assert items[5]["role"] == "assistant" and items[6]["content"] == "again"
    assert "previous_response_id" not in fake.last_request_body

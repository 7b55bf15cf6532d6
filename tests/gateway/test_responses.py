"""The OpenAI Responses API through the official SDK, translated for the fake
chat-completions upstream: answers, streams, tools, stored conversation state, records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from reef.experience import RecordView
from reef.harness import Bundle, Harness, write_bundle
from reef.upstream import UpstreamError, canonical_request, response_shell
from reef.upstream.responses.relay import ResponsesRelay
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call as call_route
from tests.gateway.test_body_checks import documented_errors

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def _record(gateway: GatewayThread, headers: Any) -> RecordView:
    return gateway.store.get_record(headers["x-reef-record-id"])


def test_a_plain_response_is_translated_and_recorded(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    raw = gateway.openai().responses.with_raw_response.create(
        model="reef/support",
        input="hello there",
        instructions="Answer briefly.",
        temperature=0.2,
        max_output_tokens=50,
        metadata={"team": "blue"},
    )
    response = raw.parse()
    assert response.status == "completed"
    assert response.output_text == "echo: hello there"
    assert response.id.startswith("resp_") and response.model == "reef/support"
    assert response.metadata == {"team": "blue"} and response.instructions == "Answer briefly."
    assert response.usage is not None and response.usage.input_tokens > 0
    # the upstream got the chat-completions translation
    sent = fake.last_request_body
    assert fake.last_request_path == "/v1/chat/completions"
    assert sent["model"] == "fake-model" and sent["temperature"] == 0.2
    assert sent["max_tokens"] == 50 and "metadata" not in sent
    assert sent["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "hello there"},
    ]
    record = _record(gateway, raw.headers)
    assert record.api == "openai.responses" and record.status == "ok"
    assert record.scenario == "support" and record.turn == 0
    assert record.session_id == raw.headers["x-reef-session-id"]
    assert record.release_id == raw.headers["x-reef-release-id"]
    assert record.request["input"] == "hello there"
    assert record.response is not None and record.response["id"] == response.id
    assert record.usage is not None
    assert record.usage["output_tokens"] == response.usage.output_tokens
    # the same canonical form as the chat dialect's
    assert canonical_request(record.api, record.request) == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "hello there"},
    ]


def test_a_streamed_response_has_the_typed_event_sequence(gateway: GatewayThread) -> None:
    raw = gateway.openai().responses.with_raw_response.create(
        model="reef/support", input="stream me please", stream=True
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
    assert final.type == "response.completed"
    assert final.response.output_text == deltas and final.response.status == "completed"
    # the receipt, in the terminal event as in the headers
    assert final.x_reef == {
        "record_id": raw.headers["x-reef-record-id"],
        "session_id": raw.headers["x-reef-session-id"],
        "release_id": raw.headers["x-reef-release-id"],
    }
    record = _record(gateway, raw.headers)
    assert record.status == "ok" and record.api == "openai.responses"
    assert record.response is not None and record.response["id"] == final.response.id
    assert "x_reef" not in record.response  # the event's, not the response object's
    assert record.response["output"][0]["content"][0]["text"] == deltas
    # a streamed response is stored too
    assert gateway.openai().responses.retrieve(final.response.id).output_text == deltas


def test_a_function_tool_round_trip_through_previous_response_id(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    client = gateway.openai()
    first_raw = client.responses.with_raw_response.create(
        model="reef/support", input="What is the weather in Paris?", tools=[WEATHER_TOOL]
    )
    first = first_raw.parse()
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].arguments == '{"city": "Paris"}'
    assert fake.last_request_body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": WEATHER_TOOL["parameters"],
            },
        }
    ]
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}
    second_raw = client.responses.with_raw_response.create(
        model="reef/support",
        previous_response_id=first.id,
        input=[output],
        tools=[WEATHER_TOOL],
    )
    second = second_raw.parse()
    assert second.output_text == "tool said: sunny"
    assert second.previous_response_id == first.id
    # the upstream saw the whole conversation: question, tool call, tool result
    assert fake.last_request_body["messages"] == [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0].call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny"},
    ]
    one, two = _record(gateway, first_raw.headers), _record(gateway, second_raw.headers)
    assert two.session_id == one.session_id == second_raw.headers["x-reef-session-id"]
    assert (one.turn, two.turn) == (0, 1)
    # the record reads alone: its input is the whole conversation
    assert [item["type"] for item in two.request["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    assert two.request["previous_response_id"] == first.id
    assert canonical_request(two.api, two.request)[1]["tool_calls"][0]["name"] == "get_weather"


def test_a_streamed_function_call(gateway: GatewayThread) -> None:
    events = list(
        gateway.openai().responses.create(
            model="reef/support",
            input="weather in Paris?",
            tools=[WEATHER_TOOL],
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.delta" in kinds
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == '{"city": "Paris"}'
    final = events[-1]
    assert final.type == "response.completed"
    call = final.response.output[-1]
    assert call.type == "function_call" and call.arguments == '{"city": "Paris"}'


def test_previous_response_id_survives_a_gateway_restart(
    tmp_path: Path, fake: FakeUpstreamThread, shared_store: dict[str, str]
) -> None:
    settings = make_settings(tmp_path, fake.base_url, store=shared_store)
    with GatewayThread(settings) as before:
        raw = before.openai().responses.with_raw_response.create(
            model="reef/support", input="remember the word kelp"
        )
        first = raw.parse()
        session = raw.headers["x-reef-session-id"]
    with GatewayThread(settings) as after:
        again = after.openai().responses.with_raw_response.create(
            model="reef/support", previous_response_id=first.id, input="what was the word?"
        )
        assert again.parse().output_text == "echo: what was the word?"
        assert fake.last_request_body["messages"] == [
            {"role": "user", "content": "remember the word kelp"},
            {"role": "assistant", "content": "echo: remember the word kelp"},
            {"role": "user", "content": "what was the word?"},
        ]
        record = _record(after, again.headers)
        assert record.session_id == session == again.headers["x-reef-session-id"]
        assert record.turn == 1
        assert after.openai().responses.retrieve(first.id).output_text == first.output_text


def test_text_format_json_schema_reaches_the_upstream(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    response = gateway.openai().responses.create(
        model="reef/support",
        input="answer in JSON",
        text={
            "format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
        },
    )
    assert fake.last_request_body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": True},
    }
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"


def test_retrieve_input_items_and_delete(gateway: GatewayThread) -> None:
    client = gateway.openai()
    first = client.responses.create(model="reef/support", input="first question")
    second = client.responses.create(
        model="reef/support", previous_response_id=first.id, input="second question"
    )
    kept = client.responses.retrieve(second.id)
    assert kept.id == second.id and kept.output_text == second.output_text
    items = list(client.responses.input_items.list(second.id, order="asc"))
    assert [item.type for item in items] == ["message", "message", "message"]
    texts = [item.content[0].text for item in items]
    assert texts == ["first question", "echo: first question", "second question"]
    newest_first = list(client.responses.input_items.list(second.id))
    assert [item.id for item in newest_first] == [item.id for item in reversed(items)]
    paged = client.responses.input_items.list(second.id, order="asc", limit=2)
    assert len(paged.data) == 2 and paged.has_more
    assert [item.id for item in paged] == [item.id for item in items]  # follows the pages
    deleted = client.responses.delete(second.id)
    assert deleted is None  # the SDK returns nothing for a delete
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(second.id)
    # the first response, and the record of the second exchange, stay
    assert client.responses.retrieve(first.id).id == first.id


def test_store_false_keeps_nothing_retrievable(gateway: GatewayThread) -> None:
    client = gateway.openai()
    raw = client.responses.with_raw_response.create(
        model="reef/support", input="forget me", store=False
    )
    response = raw.parse()
    assert response.output_text == "echo: forget me" and response.store is False
    assert _record(gateway, raw.headers).status == "ok"  # recorded as experience all the same
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(
            model="reef/support", previous_response_id=response.id, input="again"
        )


def test_unknown_and_other_scenarios_responses_are_404(make_gateway: Any) -> None:
    keys = [
        {"id": "a", "key": "sk-a", "role": "inference", "scenarios": ["support"]},
        {"id": "b", "key": "sk-b", "role": "inference", "scenarios": ["billing"]},
    ]
    gateway = make_gateway(auth={"keys": keys})
    support, billing = gateway.openai("sk-a"), gateway.openai("sk-b")
    first = support.responses.create(model="reef/support", input="mine")
    with pytest.raises(openai.NotFoundError) as info:
        support.responses.create(
            model="reef/support", previous_response_id="resp_unknown", input="next"
        )
    assert info.value.body == {
        "message": "response 'resp_unknown' not found in scenario 'support'",
        "type": "not_found_error",
        "param": None,
        "code": 404,
    }
    # another scenario's response: not found, whether continued, read or deleted
    with pytest.raises(openai.NotFoundError):
        billing.responses.create(model="reef/billing", previous_response_id=first.id, input="x")
    with pytest.raises(openai.NotFoundError):
        billing.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        billing.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        billing.responses.input_items.list(first.id)
    named = gateway.openai("sk-a", **{"x-reef-scenario": "billing"})
    with pytest.raises(openai.NotFoundError):
        named.responses.retrieve(first.id)
    assert support.responses.retrieve(first.id).id == first.id
    with pytest.raises(openai.AuthenticationError):
        gateway.openai("sk-wrong").responses.retrieve(first.id)


@pytest.mark.parametrize(
    ("extra", "param", "named"),
    [
        (
            {"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]},
            "input[0].type",
            "reasoning",
        ),
        (
            {"input": [{"type": "web_search_call", "id": "ws_1", "status": "completed"}]},
            "input[0].type",
            "web_search_call",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "item_reference"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type", "web_search"),
        (
            {"input": "hi", "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
            "tools[0].type",
            "code_interpreter",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
            "input_file",
        ),
        ({"input": "hi", "include": ["reasoning.encrypted_content"]}, "include", "include"),
        ({"input": "hi", "reasoning": {"summary": "auto"}}, "reasoning.summary", "summary"),
        ({"input": "hi", "truncation": "auto"}, "truncation", "truncation"),
        ({"input": "hi", "conversation": "conv_1"}, "conversation", "conversation"),
        ({"input": "hi", "frobnicate": 1}, "frobnicate", "frobnicate"),
        ({"input": "hi", "temperature": "hot"}, "temperature", "temperature"),
        ({}, "input", "input"),
    ],
)
def test_what_cannot_be_translated_is_refused_naming_it(
    module_gateway: GatewayThread, extra: dict[str, Any], param: str, named: str
) -> None:
    before = module_gateway.writer_stats.written_total
    with pytest.raises(openai.BadRequestError) as info:
        module_gateway.openai().responses.create(model="reef/support", extra_body=extra)
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param
    assert named in body["message"] and body["type"] == "invalid_request_error"
    assert module_gateway.writer_stats.written_total == before
    # the OpenAPI document says so too
    assert documented_errors("ResponsesRequest", {"model": "reef/support", **extra})


def test_the_bodies_sent_here_fit_the_documented_schema() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    for body in (
        {"input": "hi", "instructions": "x", "temperature": 0.2, "metadata": {"a": "b"}},
        {"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": "auto", "stream": True},
        {"input": "hi", "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}}},
        {
            "previous_response_id": "resp_1",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "ok"},
            ],
            "store": False,
        },
    ):
        assert documented_errors("ResponsesRequest", body) == [], body


def test_an_upstream_failure_mid_stream_is_response_failed(gateway: GatewayThread) -> None:
    raw = gateway.openai().responses.with_raw_response.create(
        model="reef/support", input="please error-mid-stream now", stream=True
    )
    events = list(raw.parse())
    assert events[0].type == "response.created"
    final = events[-1]
    assert final.type == "response.failed"
    assert final.response.status == "failed" and final.response.error is not None
    assert "error-mid-stream" in final.response.error.message
    assert final.x_reef["record_id"] == raw.headers["x-reef-record-id"]
    record = _record(gateway, raw.headers)
    assert record.status == "error" and record.error is not None
    assert "error-mid-stream" in record.error
    assert record.response is not None and record.response["status"] == "failed"
    with pytest.raises(openai.NotFoundError):  # a failed response is not kept
        gateway.openai().responses.retrieve(final.response.id)


def test_an_idempotent_stream_is_replayed_from_its_record(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    client = gateway.openai(**{"x-reef-idempotency-key": "responses-1"})
    first = list(client.responses.create(model="reef/support", input="once", stream=True))
    calls = fake.requests_received("/v1/chat/completions")
    again = list(client.responses.create(model="reef/support", input="once", stream=True))
    assert fake.requests_received("/v1/chat/completions") == calls
    # the stored answer as a stream of its own: one delta per item, the same response
    assert again[-1].type == first[-1].type == "response.completed"
    assert again[-1].response == first[-1].response
    assert again[-1].x_reef == first[-1].x_reef  # the same receipt
    assert "".join(e.delta for e in again if e.type == "response.output_text.delta") == "echo: once"
    assert [e.sequence_number for e in again] == list(range(len(again)))


def test_an_uncaptured_stream_ends_without_a_record_id(gateway: GatewayThread) -> None:
    client = gateway.openai(**{"x-reef-capture": "off"})
    raw = client.responses.with_raw_response.create(
        model="reef/support", input="off the record", stream=True
    )
    final = list(raw.parse())[-1]
    assert final.type == "response.completed"
    assert final.x_reef == {
        "session_id": raw.headers["x-reef-session-id"],
        "release_id": raw.headers["x-reef-release-id"],
    }


def test_a_client_resending_the_history_joins_the_session_by_prefix(
    gateway: GatewayThread,
) -> None:
    """As the Agents SDK does by default: no previous_response_id, the output items of
    the last turn sent back in the next input."""
    client = gateway.openai()
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first_raw = client.responses.with_raw_response.create(
        model="reef/support", instructions="Be helpful.", input=[question], tools=[WEATHER_TOOL]
    )
    first = first_raw.parse()
    call = first.output[-1]
    assert call.type == "function_call"
    history = [question, *(item.model_dump() for item in first.output)]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "rain"}
    second_raw = client.responses.with_raw_response.create(
        model="reef/support",
        instructions="Be helpful.",
        input=[*history, output],
        tools=[WEATHER_TOOL],
    )
    assert second_raw.parse().output_text == "tool said: rain"
    one, two = _record(gateway, first_raw.headers), _record(gateway, second_raw.headers)
    assert two.session_id == one.session_id and two.turn == 1
    assert two.prompt_hash != one.prompt_hash


def test_a_managed_harness_renders_into_the_translated_request(
    make_gateway: Any, fake: FakeUpstreamThread, tmp_path: Path
) -> None:
    bundle = tmp_path / "harness"
    write_bundle(
        Bundle(harness=Harness(schema_version=1, system_prompt="You triage tickets."), files={}),
        bundle,
    )
    gateway = make_gateway(
        scenarios={"agent": {"upstream": "fake", "harness": "managed", "initial_harness": bundle}}
    )
    raw = gateway.openai().responses.with_raw_response.create(
        model="reef/agent", input="hello", instructions="Be brief."
    )
    assert raw.parse().output_text == "echo: hello"
    system = fake.last_request_body["messages"][0]
    assert system["role"] == "system"
    assert "You triage tickets." in system["content"] and "Be brief." in system["content"]
    record = _record(gateway, raw.headers)
    assert record.request == {"model": "reef/agent", "input": "hello", "instructions": "Be brief."}
    assert record.rendered_request is not None
    assert record.rendered_request["messages"][0] == system


def test_events_read_with_the_upstreams_error_still_go_out_before_response_failed() -> None:
    """The error and the chunks before it may arrive in one read."""
    relay = ResponsesRelay(response_shell({"input": "x"}, "resp_1", "reef/support", 0))
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}
    error = {"error": {"message": "overloaded", "type": "server_error", "code": 503}}
    read = b"data: " + orjson.dumps(chunk) + b"\n\ndata: " + orjson.dumps(error) + b"\n\n"
    with pytest.raises(UpstreamError) as info:
        relay.feed(read)
    sent = relay.failure(info.value, b"data: the caller's error event\n\n").decode()
    assert "the caller's error event" not in sent  # a Responses stream ends its own way
    kinds = [line[len("event: ") :] for line in sent.splitlines() if line.startswith("event:")]
    assert kinds[0] == "response.created" and kinds[-1] == "response.failed"
    assert "response.output_text.delta" in kinds
    response, _ = relay.result()
    assert response["status"] == "failed" and "overloaded" in response["error"]["message"]


def test_a_responses_tool_loop_assembles_into_a_trajectory(gateway: GatewayThread) -> None:
    client = gateway.openai()
    first = client.responses.create(
        model="reef/support", input="What is the weather in Paris?", tools=[WEATHER_TOOL]
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second_raw = client.responses.with_raw_response.create(
        model="reef/support", previous_response_id=first.id, input=[output], tools=[WEATHER_TOOL]
    )
    session = second_raw.headers["x-reef-session-id"]
    answer = call_route(gateway.port, "GET", f"/reef/scenarios/support/sessions/{session}")
    assert answer.status == 200, answer.body
    tree = answer.json()["trajectory"]
    root, reply_turn = tree["turns"]
    assert reply_turn["parent"] == root["id"]
    assert root["tools"][0]["function"]["name"] == "get_weather"
    assert [c["name"] for c in root["reply"]["tool_calls"]] == ["get_weather"]
    assert [r["tool_call_id"] for r in reply_turn["tool_results"]] == [call.call_id]
    assert reply_turn["reply"]["content"] == "tool said: sunny"

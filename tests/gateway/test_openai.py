"""The OpenAI dialect through the official SDK: receipts, records, streaming, tools."""

from __future__ import annotations

import openai
import pytest

from reef.releases import Release, ReleaseChain
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def client(gateway: GatewayThread, **headers: str) -> openai.OpenAI:
    return gateway.openai(**headers)


def test_completion_is_recorded_with_its_receipt(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="reef/support",
        messages=[{"role": "user", "content": "hello there"}],
        temperature=0.2,
    )
    completion = raw.parse()
    record_id = raw.headers["x-reef-record-id"]
    assert raw.headers["x-reef-agent-record-id"] == record_id
    record = gateway.store.get_record(record_id)
    # the scenario got its first ("create") release, and the record names it
    head = ReleaseChain(gateway.database).head("support")
    assert head is not None and head.operation == "create"
    assert raw.headers["x-reef-release-id"] == head.id == record.release_id
    assert record.scenario == "support"
    assert record.status == "ok"
    assert record.session_id == raw.headers["x-reef-session-id"]
    assert record.turn == 0
    assert record.api == "openai.chat"
    assert record.request["messages"] == [{"role": "user", "content": "hello there"}]
    assert record.request["temperature"] == 0.2
    assert record.response is not None
    text = completion.choices[0].message.content
    assert text and "hello there" in text
    assert record.response["choices"][0]["message"]["content"] == text
    assert completion.usage is not None and record.usage is not None
    assert record.usage["total_tokens"] == completion.usage.total_tokens
    assert record.latency_ms > 0
    # the upstream got the configured model and key, never the client's credentials
    assert fake.last_request_body["model"] == "fake-model"
    assert fake.last_request_headers["authorization"] == "Bearer upstream-secret"


def test_scenario_from_header_and_default(gateway: GatewayThread) -> None:
    raw = client(
        gateway, **{"x-reef-scenario": "support"}
    ).chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "a"}]
    )
    assert gateway.store.get_record(raw.headers["x-reef-record-id"]).scenario == "support"
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "b"}]
    )
    assert gateway.store.get_record(raw.headers["x-reef-record-id"]).scenario == "default"


def test_tags_and_release_pins(gateway: GatewayThread) -> None:
    client(gateway).chat.completions.create(
        model="reef/billing", messages=[{"role": "user", "content": "create billing"}]
    )
    chain = ReleaseChain(gateway.database)
    support_head = chain.head("support") or _first_release(gateway, "support", chain)
    headers = {"x-reef-tag-team": "blue", "x-reef-release": support_head.id}
    raw = client(gateway, **headers).chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "tagged"}]
    )
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.tags == {"team": "blue"}
    assert record.release_id == support_head.id == raw.headers["x-reef-release-id"]

    billing_head = chain.head("billing")
    assert billing_head is not None
    with pytest.raises(openai.BadRequestError) as info:
        client(gateway, **{"x-reef-release": billing_head.id}).chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": "cross"}]
        )
    assert "belongs to scenario 'billing'" in info.value.message
    with pytest.raises(openai.NotFoundError):
        client(gateway, **{"x-reef-release": "no-such-release"}).chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": "missing"}]
        )


def _first_release(gateway: GatewayThread, scenario: str, chain: ReleaseChain) -> Release:
    client(gateway).chat.completions.create(
        model=f"reef/{scenario}", messages=[{"role": "user", "content": "create"}]
    )
    head = chain.head(scenario)
    assert head is not None
    return head


def test_purpose_eval_is_recorded_and_bad_purpose_is_400(gateway: GatewayThread) -> None:
    raw = client(gateway, **{"x-reef-purpose": "eval"}).chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "graded"}]
    )
    assert gateway.store.get_record(raw.headers["x-reef-record-id"]).purpose == "eval"
    plain = client(gateway).chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "live"}]
    )
    assert gateway.store.get_record(plain.headers["x-reef-record-id"]).purpose == "serve"
    with pytest.raises(openai.BadRequestError) as info:
        client(gateway, **{"x-reef-purpose": "canary"}).chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": "sneaky"}]
        )
    assert "x-reef-purpose must be one of serve, eval" in info.value.message


def test_capture_off_records_nothing(gateway: GatewayThread) -> None:
    before = gateway.writer_stats.written_total
    raw = client(gateway, **{"x-reef-capture": "off"}).chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "private"}]
    )
    assert raw.parse().choices[0].message.content
    assert "x-reef-record-id" not in raw.headers
    assert raw.headers["x-reef-capture"] == "off"
    assert gateway.writer_stats.written_total == before


def test_stream_is_reassembled_with_usage(gateway: GatewayThread) -> None:
    with client(gateway).chat.completions.with_streaming_response.create(
        model="reef/support",
        messages=[{"role": "user", "content": "stream these words please"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage]
    assert text and "stream these words please" in text
    assert len(usage) == 1
    record = gateway.store.get_record(record_id)
    assert record.status == "ok"
    assert record.response is not None
    assert record.response["choices"][0]["message"]["content"] == text
    assert record.usage is not None
    assert record.usage["completion_tokens"] == usage[0].completion_tokens


def test_stream_without_usage_request_still_records_usage(gateway: GatewayThread) -> None:
    with client(gateway).chat.completions.with_streaming_response.create(
        model="reef/support", messages=[{"role": "user", "content": "no usage"}], stream=True
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        chunks = list(response.parse())
    assert all(c.usage is None for c in chunks), "the client did not ask for usage"
    record = gateway.store.get_record(record_id)
    assert record.usage is not None and record.usage["total_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_are_recorded(gateway: GatewayThread, stream: bool) -> None:
    kwargs = {
        "model": "reef/support",
        "messages": [{"role": "user", "content": "what is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
    }
    if stream:
        with client(gateway).chat.completions.with_streaming_response.create(
            stream=True, **kwargs
        ) as response:
            record_id = response.headers["x-reef-record-id"]
            chunks = list(response.parse())
        finish = [
            c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
        ]
        assert finish == ["tool_calls"]
    else:
        raw = client(gateway).chat.completions.with_raw_response.create(**kwargs)
        record_id = raw.headers["x-reef-record-id"]
        call = raw.parse().choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather"
    record = gateway.store.get_record(record_id)
    assert record.request["tools"][0]["function"]["name"] == "get_weather"
    assert record.response is not None
    calls = record.response["choices"][0]["message"]["tool_calls"]
    assert calls[0]["function"]["name"] == "get_weather"
    assert calls[0]["function"]["arguments"].replace(" ", "") == '{"city":"Paris"}'


def test_follow_up_turn_joins_the_session(gateway: GatewayThread) -> None:
    api = client(gateway)
    first = api.chat.completions.with_raw_response.create(
        model="reef/support",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    )
    reply = first.parse().choices[0].message
    second = api.chat.completions.with_raw_response.create(
        model="reef/support",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": reply.content},
            {"role": "user", "content": "and then?"},
        ],
    )
    session = first.headers["x-reef-session-id"]
    assert second.headers["x-reef-session-id"] == session
    turns = gateway.store.get_session("support", session)
    assert [t.turn for t in turns] == [0, 1]
    assert [t.id for t in turns] == [
        first.headers["x-reef-record-id"],
        second.headers["x-reef-record-id"],
    ]
    # a different conversation that merely looks similar starts its own session
    other = api.chat.completions.with_raw_response.create(
        model="reef/support",
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "something else entirely"},
            {"role": "user", "content": "and then?"},
        ],
    )
    assert other.headers["x-reef-session-id"] != session


def test_session_header_wins(gateway: GatewayThread) -> None:
    api = client(gateway, **{"x-reef-session": "conversation-42"})
    ids = []
    for text in ("one", "two"):
        raw = api.chat.completions.with_raw_response.create(
            model="reef/support", messages=[{"role": "user", "content": text}]
        )
        assert raw.headers["x-reef-session-id"] == "conversation-42"
        ids.append(raw.headers["x-reef-record-id"])
    turns = gateway.store.get_session("support", "conversation-42")
    assert [(t.id, t.turn) for t in turns] == [(ids[0], 0), (ids[1], 1)]


def test_idempotency_key_returns_the_first_receipt(gateway: GatewayThread) -> None:
    api = client(gateway, **{"x-reef-idempotency-key": "retry-7"})
    first = api.chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "once"}]
    )
    second = api.chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "once"}]
    )
    assert first.headers["x-reef-record-id"] == second.headers["x-reef-record-id"]
    page = gateway.store.list_records("support", _filter(), None, 50)
    assert [r.id for r in page.records].count(first.headers["x-reef-record-id"]) == 1
    assert len(page.records) == 1


def _filter():  # type: ignore[no-untyped-def]
    from reef.experience import RecordFilter

    return RecordFilter()


def test_models_lists_scenarios_and_upstream_models(gateway: GatewayThread) -> None:
    ids = [model.id for model in client(gateway).models.list()]
    assert "reef/support" in ids and "reef/default" in ids
    assert "fake-model" in ids

"""Idempotency keys are single-flight: requests with one key and one body make one upstream
call and get one answer and one receipt, concurrent or later, streamed or not; another
body under the key is a 409 in the caller's dialect."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from sqlalchemy import event, func, select

from reef.db.schema import idempotency_claims
from reef.experience import RecordFilter
from reef.gateway.idempotency import IdempotentFlights
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call, holds_connection, send_unread
from tests.gateway.sdk_calls import Reply, turn
from tests.polling import eventually

KEY = "x-reef-idempotency-key"
PATHS = ("/v1/chat/completions", "/v1/messages")
# (client dialect, scenario): OpenAI on the OpenAI fake, Anthropic on the Anthropic
# fake, Anthropic translated onto the OpenAI fake
ROUTES = [("openai", "support"), ("anthropic", "claude"), ("anthropic", "support")]
ROUTE_IDS = ["openai", "anthropic", "translated"]
OPENAI_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def upstream_calls(fake: FakeUpstreamThread) -> int:
    return sum(fake.requests_received(path) for path in PATHS)


def flights(gateway: GatewayThread) -> IdempotentFlights:
    endpoint: Any = gateway.app.routes["/v1/chat/completions"]
    flights: IdempotentFlights = endpoint.endpoint.routes.flights  # inside its guard
    return flights


def sdk(gateway: GatewayThread, dialect: str) -> openai.OpenAI | anthropic.Anthropic:
    return gateway.openai() if dialect == "openai" else gateway.anthropic()


@pytest.fixture
def fresh(fake: FakeUpstreamThread) -> FakeUpstreamThread:
    fake.reset()
    return fake


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("dialect", "scenario"), ROUTES, ids=ROUTE_IDS)
def test_concurrent_requests_with_one_key_make_one_upstream_call(
    gateway: GatewayThread, fresh: FakeUpstreamThread, dialect: str, scenario: str, stream: bool
) -> None:
    client = sdk(gateway, dialect)
    headers = {"x-reef-scenario": scenario, KEY: f"burst-{dialect}-{scenario}-{stream}"}

    def send() -> Reply:
        return turn(client, "hold-answer once for all", stream=stream, headers=headers)

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(send) for _ in range(16)]
        # the leader is at the upstream and the 15 others wait for its answer
        eventually(lambda: fresh.held == 1 and flights(gateway).waiting == 15, "15 waiters")
        fresh.release_held()
        replies = [future.result(timeout=60) for future in futures]

    assert upstream_calls(fresh) == 1
    assert len(set(replies)) == 1, set(replies)  # receipt, session, text, stop: all one
    reply = replies[0]
    assert reply.status == 200 and "once for all" in reply.text and reply.stop
    record = gateway.store.get_record(reply.receipt or "")
    assert record.status == "ok" and record.idempotency_key == headers[KEY]
    assert record.session_id == reply.session
    assert len(flights(gateway)._flights) == 0  # nothing kept once the record is stored


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("dialect", "scenario"), ROUTES, ids=ROUTE_IDS)
def test_a_later_request_is_answered_from_the_store(
    gateway: GatewayThread, fresh: FakeUpstreamThread, dialect: str, scenario: str, stream: bool
) -> None:
    client = sdk(gateway, dialect)
    headers = {"x-reef-scenario": scenario, KEY: "later-1"}
    tools = [OPENAI_TOOL if dialect == "openai" else ANTHROPIC_TOOL]
    kwargs: dict[str, Any] = {"stream": stream, "headers": headers, "tools": tools}
    if dialect == "openai":
        kwargs["include_usage"] = True
    first = turn(client, "what is the weather in Paris?", **kwargs)
    assert first.status == 200 and first.tools == (("get_weather", '{"city":"Paris"}'),)
    calls = upstream_calls(fresh)

    again = turn(client, "what is the weather in Paris?", **kwargs)
    assert again == first  # the stored answer, streamed again when the client streams
    assert upstream_calls(fresh) == calls
    records = gateway.store.list_records(scenario, RecordFilter(), None, 50).records
    assert [r.id for r in records if r.idempotency_key == "later-1"] == [first.receipt]


def test_a_replayed_stream_keeps_text_stop_and_usage(
    gateway: GatewayThread, fresh: FakeUpstreamThread
) -> None:
    client = gateway.openai()
    headers = {"x-reef-scenario": "support", KEY: "usage-1"}
    first = turn(client, "count these words", stream=True, headers=headers, include_usage=True)
    again = turn(client, "count these words", stream=True, headers=headers, include_usage=True)
    assert again == first and first.usage and first.stop == "stop"
    assert upstream_calls(fresh) == 1


@pytest.mark.parametrize(
    ("path", "scenario", "shape"),
    [
        ("/v1/chat/completions", "support", "openai"),
        ("/v1/messages", "claude", "anthropic"),
    ],
)
def test_the_same_key_with_another_body_is_409(
    gateway: GatewayThread, fresh: FakeUpstreamThread, path: str, scenario: str, shape: str
) -> None:
    headers = {"x-reef-scenario": scenario, KEY: "shared-key"}

    def body(text: str, stream: bool = False) -> dict[str, Any]:
        return {
            "model": "m",
            "max_tokens": 16,
            "stream": stream,
            "messages": [{"role": "user", "content": text}],
        }

    first: list[Any] = []
    leader = threading.Thread(
        target=lambda: first.append(
            call(gateway.port, "POST", path, body("hold-answer a"), headers)
        )
    )
    leader.start()
    try:
        eventually(lambda: fresh.held == 1, "the first request at the upstream")
        during = call(gateway.port, "POST", path, body("another question"), headers)
    finally:
        fresh.release_held()
        leader.join(timeout=30)
    assert first[0].status == 200
    after = call(gateway.port, "POST", path, body("hold-answer a", stream=True), headers)
    for refused in (during, after):
        assert refused.status == 409, refused.body
        error = refused.json()
        if shape == "openai":
            assert error["error"]["type"] == "conflict_error"
            message = error["error"]["message"]
        else:
            assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
            message = error["error"]["message"]
        assert "shared-key" in message and "different request" in message
    assert upstream_calls(fresh) == 1


def test_a_failed_answer_is_not_replayed(gateway: GatewayThread, fresh: FakeUpstreamThread) -> None:
    """Only a complete answer holds the key: a retry after an upstream error goes
    upstream again, and each attempt's receipt names its own record."""
    client = gateway.openai()
    headers = {"x-reef-scenario": "support", KEY: "flaky-1"}
    first = turn(client, "bad-request please", stream=False, headers=headers)
    second = turn(client, "bad-request please", stream=False, headers=headers)
    assert first.status == second.status == 400
    assert first.receipt and second.receipt and first.receipt != second.receipt
    assert upstream_calls(fresh) == 2
    for receipt in (first.receipt, second.receipt):
        record = gateway.store.get_record(receipt)
        assert record.status == "error" and record.idempotency_key is None


def test_a_waiter_leads_when_the_leader_leaves_before_the_answer(
    tmp_path: Path, fresh: FakeUpstreamThread
) -> None:
    # ASGI 2.4: the leader's stream is never read once its client has gone (on uvicorn's
    # 2.3 Starlette may still relay it to its end, and the waiter would get that answer)
    with GatewayThread(make_settings(tmp_path, fresh.base_url), asgi_spec="2.4") as gateway:
        _leader_leaves(gateway, fresh)


def _leader_leaves(gateway: GatewayThread, fresh: FakeUpstreamThread) -> None:
    body = (
        b'{"model": "m", "stream": true, '
        b'"messages": [{"role": "user", "content": "hold-answer wait for me"}]}'
    )
    headers = {"x-reef-scenario": "support", KEY: "left-1"}
    leader = send_unread(gateway.port, "/v1/chat/completions", body, headers)
    eventually(lambda: fresh.held == 1, "the leader at the upstream")
    client = gateway.openai()
    replies: list[Reply] = []
    waiter = threading.Thread(
        target=lambda: replies.append(
            turn(client, "hold-answer wait for me", stream=True, headers=headers, model="m")
        )
    )
    waiter.start()
    eventually(lambda: flights(gateway).waiting == 1, "the second request waiting")
    leader_port = leader.getsockname()[1]
    leader.close()
    eventually(
        lambda: not holds_connection(gateway.server, leader_port),
        "the gateway to see the leader go",
    )
    fresh.release_held()
    waiter.join(timeout=30)

    (reply,) = replies
    assert reply.status == 200 and "wait for me" in reply.text
    assert upstream_calls(fresh) == 2  # the leader's call was lost with its client
    record = gateway.store.get_record(reply.receipt or "")
    assert record.status == "ok" and record.idempotency_key == "left-1"
    eventually(
        lambda: any(r.status == "aborted" for r in _records(gateway, "support")),
        "the leader's exchange recorded as aborted",
    )


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_two_gateways_on_one_store(
    tmp_path: Path, fresh: FakeUpstreamThread, shared_store: dict[str, str], durability: str
) -> None:
    store = {**shared_store, "durability": durability}  # async: claims kept until written
    settings = make_settings(tmp_path, fresh.base_url, store=store)
    with GatewayThread(settings) as one, GatewayThread(settings) as two:
        headers = {"x-reef-scenario": "support"}
        # one after the other: the second gateway answers from the store
        first = turn(one.openai(), "across", stream=False, headers={**headers, KEY: "seq"})
        again = turn(two.openai(), "across", stream=False, headers={**headers, KEY: "seq"})
        assert again == first and upstream_calls(fresh) == 1

        # at once: the gateway that claims the key first calls the upstream, the other
        # waits for its record and answers from it, with the same receipt
        for stream in (False, True):
            fresh.reset()
            waits = store_waits(one) + store_waits(two)
            key = {**headers, KEY: f"race-{stream}"}
            with ThreadPoolExecutor(2) as pool:
                futures = [
                    pool.submit(turn, gw.openai(), "hold-answer race", stream=stream, headers=key)
                    for gw in (one, two)
                ]
                eventually(
                    lambda w=waits: (
                        fresh.held == 1 and store_waits(one) + store_waits(two) == w + 1
                    ),
                    "one gateway at the upstream, the other waiting on the store",
                )
                fresh.release_held()
                replies = [future.result(timeout=30) for future in futures]
            assert upstream_calls(fresh) == 1
            keyed = [r for r in _records(one, "support") if r.idempotency_key == key[KEY]]
            assert len(keyed) == 1  # one record, under the key
            assert replies[0] == replies[1]
            assert replies[0].status == 200 and "race" in replies[0].text
            assert replies[0].receipt == keyed[0].id
            assert len([r for r in _records(one, "support") if "race" in str(r.request)]) == (
                2 if stream else 1  # and the earlier race's record
            )

        # another request under a key the other gateway is answering: 409, no call
        fresh.reset()
        key = {**headers, KEY: "claimed"}
        with ThreadPoolExecutor(1) as pool:
            leader = pool.submit(turn, one.openai(), "hold-answer mine", stream=False, headers=key)
            eventually(lambda: fresh.held == 1, "the first gateway at the upstream")
            refused = call(two.port, "POST", "/v1/chat/completions", _chat("not mine"), key)
            fresh.release_held()
            assert leader.result(timeout=30).status == 200
        assert refused.status == 409, refused.body
        assert "claimed" in refused.json()["error"]["message"]
        assert upstream_calls(fresh) == 1
        # and no claim is left once the answers are stored
        eventually(
            lambda: all(claims_held(gw) == 0 for gw in (one, two)),
            "the claims released",
        )


def test_requests_without_a_key_never_touch_the_claims(
    gateway: GatewayThread, fresh: FakeUpstreamThread
) -> None:
    """The hot path: no idempotency key, no claim statement (counted at the engine)."""
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    engine = gateway.database.engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        client = gateway.openai()
        headers = {"x-reef-scenario": "support"}
        for stream in (False, True, False):
            assert turn(client, "no key", stream=stream, headers=headers).status == 200
        assert statements, "the listener sees the store's statements"
        assert not [s for s in statements if "idempotency_claims" in s]
        keyed = turn(client, "a key", stream=False, headers={**headers, KEY: "counted"})
        assert keyed.status == 200
        eventually(
            lambda: len([s for s in statements if "idempotency_claims" in s]) >= 2,
            "a keyed request's claim and release",
        )
    finally:
        event.remove(engine, "before_cursor_execute", seen)


def store_waits(gateway: GatewayThread) -> float:
    """Requests of ``gateway`` that waited for another gateway's claim."""
    metrics = gateway.app.state.reef.metrics.render().decode()
    for line in metrics.splitlines():
        if line.startswith('reef_idempotency_waits_total{where="store"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def claims_held(gateway: GatewayThread) -> int:
    with gateway.database.read() as conn:
        return int(conn.scalar(select(func.count()).select_from(idempotency_claims)) or 0)


def _chat(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def _records(gateway: GatewayThread, scenario: str) -> list[Any]:
    return list(gateway.store.list_records(scenario, RecordFilter(), None, 200).records)

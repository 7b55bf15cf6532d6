"""Prices, budgets and rate limits through the official SDKs on a real gateway: each
record's cost, a 402 exactly when a scenario's monthly budget is crossed (and service
back when the window rolls), a 429 from the rate limiter; clocks moved, never slept."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import anthropic
import httpx
import openai
import pytest
from typer.testing import CliRunner

from reef.cli.main import app
from tests.fakes.clock import FakeClock
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread

# A dollar per input token and two per output token: a record's cost reads as tokens.
PRICES = {"fake-model": {"input_per_mtok": 1e6, "output_per_mtok": 2e6}}
CLAUDE_PRICES = {"fake-claude": {"input_per_mtok": 1e6, "output_per_mtok": 3e6}}
NOW = datetime(2026, 12, 30, 12, 0, tzinfo=UTC)
NEW_YEAR = datetime(2027, 1, 1, tzinfo=UTC)


def upstreams(fake_url: str, priced: bool = True) -> dict[str, Any]:
    common = {"read_timeout_seconds": 2, "total_timeout_seconds": 5}
    return {
        "fake": {
            "type": "openai",
            "base_url": fake_url,
            "model": "fake-model",
            "prices": PRICES if priced else {},
            **common,
        },
        "claude": {
            "type": "anthropic",
            "base_url": fake_url,
            "model": "fake-claude",
            "prices": CLAUDE_PRICES,
            **common,
        },
    }


def clocked(gateway: GatewayThread, clock: FakeClock) -> GatewayThread:
    gateway.app.state.reef.spend.clock = clock
    return gateway


@pytest.fixture
def priced(make_gateway: Callable[..., GatewayThread], fake: Any) -> GatewayThread:
    return make_gateway(upstreams=upstreams(fake.base_url))


def chat_cost(usage: dict[str, Any]) -> float:
    return usage["prompt_tokens"] * 1.0 + usage["completion_tokens"] * 2.0


def test_a_chat_record_carries_its_cost_and_price(priced: GatewayThread) -> None:
    raw = priced.openai().chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "what does it cost"}]
    )
    record = priced.store.get_record(raw.headers["x-reef-record-id"])
    assert record.usage is not None and record.usage["completion_tokens"] > 0
    assert record.cost == pytest.approx(chat_cost(record.usage))
    assert record.price == {
        "model": "fake-model",
        "input_per_mtok": 1e6,
        "output_per_mtok": 2e6,
        "cached_input_per_mtok": None,
    }


def test_a_streamed_record_is_priced_from_the_usage_the_client_did_not_ask_for(
    priced: GatewayThread,
) -> None:
    with priced.openai().chat.completions.with_streaming_response.create(
        model="reef/support",
        messages=[{"role": "user", "content": "stream the cost"}],
        stream=True,
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        chunks = list(response.iter_lines())
    assert chunks and not any('"usage":{' in line for line in chunks)  # stripped for it
    record = priced.store.get_record(record_id)
    assert record.usage is not None
    assert record.cost == pytest.approx(chat_cost(record.usage)) and record.cost > 0


def test_a_responses_record_is_priced_from_its_usage_shape(priced: GatewayThread) -> None:
    raw = priced.openai().responses.with_raw_response.create(
        model="reef/support", input="price the responses api"
    )
    record = priced.store.get_record(raw.headers["x-reef-record-id"])
    usage = record.usage
    assert usage is not None and "input_tokens" in usage
    expected = usage["input_tokens"] * 1.0 + usage["output_tokens"] * 2.0
    assert record.cost == pytest.approx(expected) and expected > 0


def test_an_anthropic_record_is_priced_at_its_upstreams_price(priced: GatewayThread) -> None:
    raw = priced.anthropic().messages.with_raw_response.create(
        model="reef/claude",
        max_tokens=50,
        messages=[{"role": "user", "content": "price the messages api"}],
    )
    record = priced.store.get_record(raw.headers["x-reef-record-id"])
    usage = record.usage
    assert usage is not None
    expected = usage["input_tokens"] * 1.0 + usage["output_tokens"] * 3.0
    assert record.cost == pytest.approx(expected) and expected > 0
    assert record.price is not None and record.price["model"] == "fake-claude"


CACHED = 2  # prompt tokens the cached fake reports read from a prompt cache
CACHED_PRICES = {
    "fake-model": {"input_per_mtok": 1e6, "output_per_mtok": 2e6, "cached_input_per_mtok": 0.25e6},
    "fake-claude": {"input_per_mtok": 1e6, "output_per_mtok": 3e6, "cached_input_per_mtok": 0.5e6},
}


@pytest.fixture(scope="module")
def cached_fake() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread(cached_prompt_tokens=CACHED) as server:
        yield server


@pytest.fixture
def cached(make_gateway: Callable[..., GatewayThread], cached_fake: Any) -> GatewayThread:
    ups = upstreams(cached_fake.base_url)
    for name, model in (("fake", "fake-model"), ("claude", "fake-claude")):
        ups[name]["prices"] = {model: CACHED_PRICES[model]}
    return make_gateway(upstreams=ups)


def test_cached_input_is_priced_at_its_price_in_every_usage_shape(cached: GatewayThread) -> None:
    """Each API's record, a stream's too, counts the cached part of its input at the
    cached price: a quarter of the input price on chat's upstream, half on Anthropic's."""
    ask = [{"role": "user", "content": "a prompt of several words read partly from cache"}]
    client = cached.openai()

    def chat(record_id: str) -> tuple[float | None, float]:
        record = cached.store.get_record(record_id)
        usage = record.usage or {}
        assert usage["prompt_tokens_details"]["cached_tokens"] == CACHED
        fresh = usage["prompt_tokens"] - CACHED
        return record.cost, fresh * 1.0 + CACHED * 0.25 + usage["completion_tokens"] * 2.0

    raw = client.chat.completions.with_raw_response.create(model="reef/support", messages=ask)
    cost, expected = chat(raw.headers["x-reef-record-id"])
    assert cost == pytest.approx(expected)
    with client.chat.completions.with_streaming_response.create(
        model="reef/support", messages=ask, stream=True
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        list(response.iter_lines())
    cost, expected = chat(record_id)
    assert cost == pytest.approx(expected)

    raw = client.responses.with_raw_response.create(model="reef/support", input=ask)
    record = cached.store.get_record(raw.headers["x-reef-record-id"])
    usage = record.usage or {}
    assert usage["input_tokens_details"]["cached_tokens"] == CACHED
    fresh = usage["input_tokens"] - CACHED
    expected = fresh * 1.0 + CACHED * 0.25 + usage["output_tokens"] * 2.0
    assert record.cost == pytest.approx(expected)

    for stream in (False, True):
        ask_claude = {"model": "reef/claude", "max_tokens": 50, "messages": ask}
        if stream:
            with cached.anthropic().messages.with_streaming_response.create(
                **ask_claude, stream=True
            ) as streamed:
                record_id = streamed.headers["x-reef-record-id"]
                list(streamed.iter_lines())
        else:
            answered = cached.anthropic().messages.with_raw_response.create(**ask_claude)
            record_id = answered.headers["x-reef-record-id"]
        record = cached.store.get_record(record_id)
        usage = record.usage or {}
        assert usage["cache_read_input_tokens"] == CACHED, stream
        expected = usage["input_tokens"] * 1.0 + CACHED * 0.5 + usage["output_tokens"] * 3.0
        assert record.cost == pytest.approx(expected), stream
        assert record.price is not None and record.price["cached_input_per_mtok"] == 0.5e6


def test_a_model_without_a_price_is_served_and_counted_unpriced(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    gateway = make_gateway(upstreams=upstreams(fake.base_url, priced=False))
    raw = gateway.openai().chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "no price"}]
    )
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.status == "ok" and record.cost is None and record.price is None
    metrics = gateway.app.state.reef.metrics.render().decode()
    assert 'reef_spend_unpriced_total{purpose="serve",scenario="support"} 1.0' in metrics


def test_within_its_budgets_and_limits_a_client_gets_the_same_answer(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    """Prices, budgets and rate limits change nothing for a request they admit: the same
    status, body and stream (no usage added to a stream that did not ask for it) in both
    dialects as a gateway without them, only ids and timings differing."""
    plain = make_gateway(upstreams=upstreams(fake.base_url, priced=False))
    spend = make_gateway(
        upstreams=upstreams(fake.base_url),
        budgets={
            "global": [{"window": "month", "money": 1e9}],
            "scenarios": {"support": [{"window": "day", "tokens": 10**9}]},
        },
        rate_limits={"scenarios": {"support": {"requests_per_minute": 10**6}}},
    )
    ids = re.compile(rb'"(chatcmpl|msg|resp)[-_][A-Za-z0-9_-]+"')

    def answers(gateway: GatewayThread) -> list[tuple[int, bytes]]:
        out = []
        chat = {"model": "reef/support", "messages": [{"role": "user", "content": "same"}]}
        claude = {**chat, "model": "reef/claude", "max_tokens": 20}
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            for path, body in (
                ("/v1/chat/completions", chat),
                ("/v1/chat/completions", {**chat, "stream": True}),
                ("/v1/messages", claude),
                ("/v1/messages", {**claude, "stream": True}),
            ):
                response = http.post(path, json=body)
                out.append((response.status_code, ids.sub(b'"<id>"', response.content)))
        return out

    assert answers(spend) == answers(plain)


def test_a_402_exactly_when_the_monthly_budget_is_crossed_then_the_month_rolls(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    limit = 40.0
    clock = FakeClock(NOW)
    gateway = clocked(
        make_gateway(
            upstreams=upstreams(fake.base_url),
            budgets={"scenarios": {"support": [{"window": "month", "money": limit}]}},
        ),
        clock,
    )
    client = gateway.openai()
    spent = 0.0
    served = 0
    while True:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="reef/support", messages=[{"role": "user", "content": f"turn {served}"}]
            )
        except openai.APIStatusError as exc:
            refusal = exc
            break
        assert spent < limit  # served only while the month's spend is under the limit
        cost = gateway.store.get_record(raw.headers["x-reef-record-id"]).cost
        assert cost is not None
        spent += cost
        served += 1
        assert served < 100
    assert spent >= limit  # refused only once it was crossed
    assert served >= 2
    assert refusal.status_code == 402
    body = refusal.response.json()
    assert body["error"]["type"] == "insufficient_quota"
    assert "budget scenario:support (month) is spent" in body["error"]["message"]
    assert "resets at 2027-01-01T00:00:00Z" in body["error"]["message"]
    headers = refusal.response.headers
    assert int(headers["retry-after"]) == int((NEW_YEAR - NOW).total_seconds())
    assert headers["x-reef-budget"] == "scenario:support/month"
    # the Anthropic dialect's shape for the same refusal
    with pytest.raises(anthropic.APIStatusError) as caught:
        gateway.anthropic().messages.create(
            model="reef/support", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 402
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "billing_error", "message": body["error"]["message"]},
    }
    # another scenario has no budget: served
    client.chat.completions.create(
        model="reef/other", messages=[{"role": "user", "content": "not budgeted"}]
    )
    clock.advance((NEW_YEAR - NOW).total_seconds())  # the window rolls
    answer = client.chat.completions.create(
        model="reef/support", messages=[{"role": "user", "content": "a new month"}]
    )
    assert answer.choices[0].message.content
    metrics = gateway.app.state.reef.metrics.render().decode()
    assert 'reef_spend_refused_total{limit="scenario:support",window="month"} 2.0' in metrics


def test_a_token_budget_of_a_key_counts_its_usage(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    gateway = clocked(
        make_gateway(
            auth={"keys": [{"id": "ci", "key": "ci-secret"}]},
            budgets={"keys": {"ci": [{"window": "day", "tokens": 8}]}},
        ),
        FakeClock(NOW),
    )
    client = gateway.openai(api_key="ci-secret")
    used = 0
    for _ in range(10):
        try:
            answer = client.chat.completions.create(
                model="reef/support", messages=[{"role": "user", "content": "one two three"}]
            )
        except openai.APIStatusError as exc:
            assert exc.status_code == 402
            assert exc.response.headers["x-reef-budget"] == "key:ci/day"
            break
        assert used < 8
        assert answer.usage is not None
        used += answer.usage.total_tokens
    assert used >= 8


def test_a_429_with_retry_after_when_the_request_rate_is_spent(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    clock = FakeClock(NOW)
    gateway = clocked(
        make_gateway(rate_limits={"scenarios": {"support": {"requests_per_minute": 2}}}), clock
    )
    client = gateway.openai()
    ask = {"model": "reef/support", "messages": [{"role": "user", "content": "quick"}]}
    client.chat.completions.create(**ask)
    client.chat.completions.create(**ask)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(**ask)
    response = caught.value.response
    assert response.status_code == 429
    assert response.headers["retry-after"] == "30"  # one request earned back at 2/min
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert "scenario:support requests_per_minute" in response.json()["error"]["message"]
    with pytest.raises(anthropic.RateLimitError) as refused:
        gateway.anthropic().messages.create(
            model="reef/support", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.response.headers["retry-after"] == "30"
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    clock.advance(30)
    client.chat.completions.create(**ask)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(**ask)
    with httpx.Client(base_url=gateway.url) as http:
        refused = http.get("/reef/status").json()["spend"]["refused"]
    assert refused == [{"limit": "scenario:support", "window": "rate", "count": 3}]
    result = CliRunner().invoke(app, ["status", "--url", gateway.url])
    assert result.exit_code == 0, result.output
    assert "refused since start: scenario:support/rate 3" in result.output


def test_a_tokens_per_minute_limit_counts_usage_not_the_reservation(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    clock = FakeClock(NOW)
    gateway = clocked(
        make_gateway(
            auth={"keys": [{"id": "ci", "key": "ci-secret"}]},
            rate_limits={"keys": {"ci": {"tokens_per_minute": 12}}},
        ),
        clock,
    )
    client = gateway.openai(api_key="ci-secret")
    ask = {"model": "reef/support", "messages": [{"role": "user", "content": "hi"}]}
    used = 0
    for _ in range(12):
        try:
            # each reserves 500 output tokens, far over the minute's 12, and is
            # admitted while any remain: settled to its usage, it leaves the rest
            answer = client.chat.completions.create(**ask, max_tokens=500)
        except openai.RateLimitError as exc:
            assert exc.response.headers["x-reef-rate-limit"] == "key:ci/tokens_per_minute"
            assert 1 <= int(exc.response.headers["retry-after"]) <= 60
            break
        assert used < 12
        assert answer.usage is not None
        used += answer.usage.total_tokens
    assert used >= 12
    clock.advance(60)  # a minute refills the bucket
    client.chat.completions.create(**ask, max_tokens=500)


def test_status_shows_each_budgets_spend_and_what_was_served(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    gateway = clocked(
        make_gateway(
            upstreams=upstreams(fake.base_url),
            budgets={"scenarios": {"support": [{"window": "month", "money": 1000}]}},
        ),
        FakeClock(NOW),
    )
    raw = gateway.openai().chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "status please"}]
    )
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    cost, usage = record.cost, record.usage
    assert cost is not None and usage is not None
    tokens = usage["prompt_tokens"] + usage["completion_tokens"]
    with httpx.Client(base_url=gateway.url) as http:
        spend = http.get("/reef/status").json()["spend"]
    assert spend["budgets"] == [
        {
            "budget": "scenario:support",
            "window": "month",
            "tokens_limit": None,
            "money_limit": 1000.0,
            "tokens": tokens,
            "money": pytest.approx(cost),
            "resets": "2027-01-01T00:00:00Z",
        }
    ]
    assert spend["served"] == [
        {
            "scenario": "support",
            "purpose": "serve",
            "cost": pytest.approx(cost),
            "tokens": tokens,
            "unpriced": 0,
        }
    ]
    result = CliRunner().invoke(app, ["status", "--url", gateway.url])
    assert result.exit_code == 0, result.output
    assert f"budget scenario:support (month): money {cost:.4f} of 1000" in result.output
    assert f"spend since start: support/serve {cost:.4f}" in result.output


def test_a_failed_call_and_a_replayed_key_give_their_reservation_back(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    gateway = clocked(
        make_gateway(
            upstreams=upstreams(fake.base_url),
            budgets={"global": [{"window": "day", "money": 100}]},
        ),
        FakeClock(NOW),
    )
    client = gateway.openai()
    # each reserves 1000 output tokens, $2000: far over the day's $100 until settled
    ask = {"model": "reef/support", "max_tokens": 1000}
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(
            **ask,
            messages=[{"role": "user", "content": "fail-500"}],  # the fake answers 500
        )
    keyed = {
        "messages": [{"role": "user", "content": "once"}],
        "extra_headers": {"x-reef-idempotency-key": "k1"},
    }
    first = client.chat.completions.create(**ask, **keyed)  # type: ignore[call-overload]
    again = client.chat.completions.create(**ask, **keyed)  # type: ignore[call-overload]
    assert again.id == first.id  # answered from the record, no upstream call
    served = client.chat.completions.create(**ask, messages=[{"role": "user", "content": "more"}])
    assert served.choices[0].message.content
    with httpx.Client(base_url=gateway.url) as http:
        budget = http.get("/reef/status").json()["spend"]["budgets"][0]
    assert 0 < budget["money"] < 100  # the two answered calls' cost, nothing reserved


def test_a_key_limited_to_scenarios_sees_only_their_budgets_and_its_own(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    day = [{"window": "day", "money": 10}]
    gateway = make_gateway(
        auth={
            "keys": [
                {"id": "ops", "key": "ops-secret", "role": "admin", "scenarios": ["support"]},
                {"id": "root", "key": "root-secret", "role": "admin"},
            ]
        },
        budgets={
            "global": day,
            "scenarios": {"support": day, "claude": day},
            "keys": {"ops": day, "root": day},
        },
    )

    def budgets(key: str) -> list[str]:
        with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {key}"}) as http:
            return [line["budget"] for line in http.get("/reef/status").json()["spend"]["budgets"]]

    assert budgets("root-secret") == [
        "global",
        "scenario:support",
        "scenario:claude",
        "key:ops",
        "key:root",
    ]
    assert budgets("ops-secret") == ["scenario:support", "key:ops"]

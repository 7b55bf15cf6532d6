"""The paired runner against a real gateway on loopback (in front of the fake upstream),
and against a small probe server where the gateway cannot show what is checked
(calls in flight, the order calls start in, a 429, a silent server)."""

from __future__ import annotations

import asyncio
import email.utils
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from reef.evaluation import GateConfig
from reef.evaluation.runner import (
    EvalRunError,
    GatewayTarget,
    collect_answers,
    reply_text,
)
from reef.evaluation.values import Answer, Arm, EvalItem
from reef.experience import canonical_exchange
from reef.learning.holdout import gate_target
from reef.releases import ReleaseChain
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

KEYS = {
    "keys": [
        {"id": "app", "key": "sk-app", "role": "inference"},
        {"id": "gate", "key": "sk-gate", "role": "inference"},
        {"id": "other-only", "key": "sk-other", "role": "inference", "scenarios": ["other"]},
    ]
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def start_gateway(directory: Path, fake: FakeUpstreamThread, **overrides: Any) -> GatewayThread:
    """A gateway whose upstream does not retry, so upstream failures reach the runner."""
    upstream = {
        "type": "openai",
        "base_url": fake.base_url,
        "api_key": "upstream-secret",
        "model": "fake-model",
        "read_timeout_seconds": 2,
        "total_timeout_seconds": 5,
        "max_retries": 0,
    }
    settings = make_settings(
        directory,
        fake.base_url,
        upstreams={"fake": upstream},
        scenarios={"support": {"upstream": "fake"}, "other": {"upstream": "fake"}},
        **overrides,
    )
    return GatewayThread(settings).__enter__()


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, fake: FakeUpstreamThread
) -> Iterator[GatewayThread]:
    gateway = start_gateway(tmp_path_factory.mktemp("gateway"), fake)
    yield gateway
    gateway.__exit__(None, None, None)


def head_id(gateway: GatewayThread, scenario: str, api_key: str = "none") -> str:
    """The scenario's head release (created by serving it once)."""
    gateway.openai(api_key).chat.completions.create(
        model=f"reef/{scenario}", messages=[{"role": "user", "content": "create"}]
    )
    head = ReleaseChain(gateway.database).head(scenario)
    assert head is not None
    return head.id


def arms_of(gateway: GatewayThread, api_key: str = "none") -> dict[Arm, str]:
    """A fresh pending candidate of ``support`` (same manifest as the head) and the head."""
    baseline = head_id(gateway, "support", api_key)
    chain = ReleaseChain(gateway.database)
    manifest = chain.get_release(baseline).manifest
    candidate = chain.propose("support", manifest, baseline, "test", "eval me")
    return {"candidate": candidate.id, "baseline": baseline}


def items(*texts: str, suite: str = "file:t", **params: Any) -> list[EvalItem]:
    return [
        EvalItem(
            id=f"q{index}",
            suite=suite,
            messages=[{"role": "user", "content": text}],
            params=dict(params),
        )
        for index, text in enumerate(texts)
    ]


def target(gateway: GatewayThread, **options: Any) -> GatewayTarget:
    return GatewayTarget(base_url=gateway.url, scenario="support", **options)


# -- through the gateway ---------------------------------------------------------------


def test_answers_are_eval_records_pinned_and_tagged_in_stable_order(
    gateway: GatewayThread,
) -> None:
    arms = arms_of(gateway)
    asked = items("alpha", "beta", "gamma")
    asked[1] = EvalItem(
        id="q1", suite="file:t", messages=asked[1].messages, params={"temperature": 0.7}
    )
    seen: list[tuple[int, int]] = []
    answers = collect_answers(
        target(gateway, concurrency=3),
        asked,
        arms,
        repeats=2,
        defaults={"max_tokens": 16, "temperature": 0.0},
        progress=lambda done, total: seen.append((done, total)),
    )

    expected = [
        (item.key, repeat, arm)
        for item in asked
        for repeat in range(2)
        for arm in ("candidate", "baseline")
    ]
    assert [(a.item_key, a.repeat, a.arm) for a in answers] == expected
    assert seen == [(done, 12) for done in range(1, 13)]
    sessions = set()
    for answer in answers:
        word = {"file:t/q0": "alpha", "file:t/q1": "beta", "file:t/q2": "gamma"}[answer.item_key]
        assert answer.error is None and answer.text == f"echo: {word}"
        assert answer.attempts == 1 and answer.latency_ms > 0
        assert answer.record_id is not None
        record = gateway.store.get_record(answer.record_id)
        assert record.purpose == "eval"
        assert record.release_id == arms[answer.arm]
        assert record.tags == {"eval-item": answer.item_key, "eval-arm": answer.arm}
        assert record.request["max_tokens"] == 16
        assert record.request["temperature"] == (0.7 if answer.item_key == "file:t/q1" else 0.0)
        sessions.add(record.session_id)
    assert len(sessions) == len(answers)  # a fresh session per call


def test_tool_calls_become_json_text(gateway: GatewayThread) -> None:
    arms = arms_of(gateway)
    answers = collect_answers(
        target(gateway),
        items("what is the weather in Paris?", tools=[WEATHER_TOOL]),
        {"candidate": arms["candidate"]},
    )
    [answer] = answers
    assert answer.text is not None
    assert '"name": "get_weather"' in answer.text and "Paris" in answer.text


def test_items_stored_in_canonical_form_are_sent_in_openai_chat_form(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    """An item as an older holdout or a regression suite stored it (canonical: flat
    tool calls, no content beside them) goes out as OpenAI chat messages."""
    arms = arms_of(gateway)
    flat = {"id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
    canonical = [
        {"role": "user", "content": "what is the weather in Paris?"},
        {"role": "assistant", "tool_calls": [flat]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    asked = EvalItem(id="flat", suite="regression:r", messages=canonical)
    [answer] = collect_answers(target(gateway), [asked], {"baseline": arms["baseline"]})
    assert answer.error is None and answer.text == "tool said: sunny"
    nested = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    expected = [canonical[0], {"role": "assistant", "content": None, "tool_calls": [nested]}]
    assert fake.last_request_body["messages"] == [*expected, canonical[2]]


def test_a_scenario_on_an_anthropic_upstream_is_asked_through_messages(
    tmp_path: Path, fake: FakeUpstreamThread
) -> None:
    """The gateway serves an Anthropic upstream's scenario on /v1/messages only, so the
    runner translates each chat-form item (tool history included) to the Messages API
    and reads the reply back as a chat completion; the gate picks that dialect from the
    scenario's upstream."""
    settings = make_settings(tmp_path, fake.base_url)
    with GatewayThread(settings) as gateway:
        gateway.anthropic().messages.create(
            model="reef/claude", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
        chain = ReleaseChain(gateway.database)
        head = chain.head("claude")
        assert head is not None
        history = [
            {"role": "user", "content": "what is the weather in Paris?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "toolu_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        ]
        asked = [
            EvalItem(id="history", suite="holdout", messages=history),
            EvalItem(
                id="call",
                suite="holdout",
                messages=[{"role": "user", "content": "the weather in Rome?"}],
                params={"tools": [WEATHER_TOOL]},
            ),
        ]
        anthropic_target = GatewayTarget(
            base_url=gateway.url, scenario="claude", dialect="anthropic", concurrency=1
        )
        answered = collect_answers(
            anthropic_target, asked, {"baseline": head.id}, defaults={"max_tokens": 32}
        )
        assert [a.error for a in answered] == [None, None]
        assert answered[0].text == "tool said: sunny"
        assert answered[1].tool_calls and answered[1].tool_calls[0]["function"]["name"] == (
            "get_weather"
        )
        sent = fake.last_request_body  # what reached the upstream: Messages, tool_use kept
        assert sent["model"] == "fake-claude" and sent["tools"][0]["name"] == "get_weather"
        record = gateway.store.get_record(answered[0].record_id or "")
        assert record.api == "anthropic.messages" and record.purpose == "eval"
        assert canonical_exchange(record).messages == history
        assert gate_target(settings, "claude", GateConfig()).dialect == "anthropic"
        assert gate_target(settings, "support", GateConfig()).dialect == "openai"


def test_unknown_candidate_aborts_the_run(gateway: GatewayThread) -> None:
    baseline = head_id(gateway, "support")
    with pytest.raises(EvalRunError) as info:
        collect_answers(
            target(gateway), items("x"), {"candidate": "no-such-candidate", "baseline": baseline}
        )
    assert info.value.status == 404
    assert info.value.arm == "candidate"
    assert "candidate" in info.value.message and "'no-such-candidate'" in info.value.message


def test_an_item_the_gateway_itself_rejects_aborts_the_run_naming_item_and_field(
    gateway: GatewayThread,
) -> None:
    arms = arms_of(gateway)
    broken = EvalItem(id="rec_7", suite="holdout", messages=[])
    with pytest.raises(EvalRunError) as info:
        collect_answers(target(gateway), [broken], {"candidate": arms["candidate"]})
    assert info.value.status == 400 and info.value.item_key == "holdout/rec_7"
    assert "with 400 on item rec_7 (holdout): " in info.value.message
    assert "'messages' must be a non-empty array" in info.value.message


def test_release_of_another_scenario_aborts_the_run(gateway: GatewayThread) -> None:
    other = head_id(gateway, "other")
    with pytest.raises(EvalRunError) as info:
        collect_answers(target(gateway), items("x"), {"baseline": other})
    assert info.value.status == 400
    assert info.value.arm == "baseline"
    assert "belongs to scenario 'other'" in info.value.message


def test_keys_that_are_wrong_or_lack_access_abort_the_run(
    tmp_path: Path, fake: FakeUpstreamThread
) -> None:
    gateway = start_gateway(tmp_path, fake, auth=KEYS, evaluation={"api_key": "sk-gate"})
    try:
        arms = arms_of(gateway, "sk-app")
        ReleaseChain(gateway.database).set_candidate_state(arms["candidate"], "evaluating")
        ok = collect_answers(target(gateway, api_key="sk-gate"), items("hi"), arms)
        assert [a.text for a in ok] == ["echo: hi", "echo: hi"]
        # an inference key that is not the gate's may not be served by a candidate
        with pytest.raises(EvalRunError) as not_gate:
            collect_answers(target(gateway, api_key="sk-app"), items("hi"), arms)
        assert not_gate.value.status == 403 and not_gate.value.arm == "candidate"
        assert "served only to the evaluation gate and admin keys" in not_gate.value.message
        with pytest.raises(EvalRunError) as denied:
            collect_answers(target(gateway, api_key="sk-other"), items("hi"), arms)
        assert denied.value.status == 403
        assert "may not use scenario 'support'" in denied.value.message
        with pytest.raises(EvalRunError) as missing:
            collect_answers(target(gateway), items("hi"), arms)
        assert missing.value.status == 401
        assert "missing API key" in missing.value.message
    finally:
        gateway.__exit__(None, None, None)


def test_failures_that_pass_are_retried(gateway: GatewayThread) -> None:
    arms = arms_of(gateway)
    asked = items(f"fail-500-once {uuid.uuid4()}", f"fail-429-once {uuid.uuid4()}")
    answers = collect_answers(target(gateway), asked, {"candidate": arms["candidate"]})
    for answer in answers:
        assert answer.error is None and answer.error_kind is None
        assert answer.text is not None and answer.text.startswith("echo: fail-")
        assert answer.attempts == 2
        assert answer.record_id is not None
        assert gateway.store.get_record(answer.record_id).status == "ok"


def test_failures_that_persist_become_error_answers(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    arms = arms_of(gateway)
    before = fake.requests_received("/v1/chat/completions")
    answers = collect_answers(target(gateway, retries=1), items("fail-500"), arms)
    assert fake.requests_received("/v1/chat/completions") - before == 4  # 2 arms x 2 tries
    for answer in answers:
        assert answer.text is None
        assert answer.error is not None
        assert "502" in answer.error and "fake upstream failure" in answer.error
        assert "after 2 attempts" in answer.error
        assert answer.error_kind == "upstream_error"  # transient: an outage, not the item
        assert answer.attempts == 2
        assert answer.record_id is not None  # the gateway recorded the failure too
        assert gateway.store.get_record(answer.record_id).status == "error"


def test_an_item_the_upstream_rejects_fails_alone(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    arms = arms_of(gateway)
    before = fake.requests_received("/v1/chat/completions")
    answers = collect_answers(
        target(gateway),
        items("bad-request", "fine"),
        {"candidate": arms["candidate"]},
    )
    assert fake.requests_received("/v1/chat/completions") - before == 2  # not retried
    rejected, fine = answers
    assert rejected.text is None and rejected.attempts == 1
    assert rejected.error is not None and "400" in rejected.error
    assert rejected.error_kind == "refused"  # the same item would be refused again
    assert fine.text == "echo: fine" and fine.error_kind is None


# -- against a probe server --------------------------------------------------------------


class Probe:
    """Stands in for the gateway: counts calls in flight and notes what each carried.

    With ``barrier`` set, a call is answered only once ``barrier`` calls are in flight
    (a run that never reaches that many fails its calls after 10 s instead of hanging).
    """

    def __init__(
        self,
        barrier: int = 1,
        refuse_first: int = 0,
        silent: bool = False,
        unreadable: bool = False,
        retry_after: str = "0",
    ) -> None:
        self.barrier = asyncio.Barrier(barrier)
        self.refuse_first = refuse_first  # 429 this many first tries of each item
        self.retry_after = retry_after  # the 429's Retry-After
        self.silent = silent
        self.unreadable = unreadable  # 200 with a body that is no completion
        self.in_flight = 0
        self.most_in_flight = 0
        self.calls: list[dict[str, str]] = []
        self.tries: dict[tuple[str, str], int] = {}
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> Probe:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.calls.append(headers)
        if self.silent:
            await asyncio.Event().wait()
        key = (headers["x-reef-tag-eval-item"], headers["x-reef-tag-eval-arm"])
        self.tries[key] = self.tries.get(key, 0) + 1
        if self.tries[key] <= self.refuse_first:
            refused = {"error": {"message": "slow down"}}
            return web.json_response(refused, status=429, headers={"Retry-After": self.retry_after})
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            async with asyncio.timeout(10):
                await self.barrier.wait()
        except TimeoutError:
            return web.json_response({"error": {"message": "barrier"}}, status=500)
        finally:
            self.in_flight -= 1
        body = await request.json()
        if self.unreadable:
            return web.json_response({"object": "chat.completion", "choices": []})
        reply = {"choices": [{"message": {"role": "assistant", "content": body["model"]}}]}
        return web.json_response(reply, headers={"x-reef-record-id": f"rec-{len(self.calls)}"})


ARMS: dict[Arm, str] = {"candidate": "cand-1", "baseline": "rel-1"}


async def test_calls_in_flight_reach_but_never_pass_the_bound() -> None:
    async with Probe(barrier=2) as probe:
        bound = GatewayTarget(base_url=probe.url, scenario="s", concurrency=2, retries=0)
        answers = await asyncio.to_thread(
            collect_answers,
            bound,
            items("a", "b", "c", "d"),
            ARMS,
        )
    assert probe.most_in_flight == 2
    assert [a.text for a in answers] == ["reef/s"] * 8


async def test_arms_of_an_item_go_out_next_to_each_other_with_eval_headers() -> None:
    async with Probe() as probe:
        serial = GatewayTarget(base_url=probe.url, scenario="s", api_key="sk-x", concurrency=1)
        answers = await asyncio.to_thread(
            collect_answers,
            serial,
            items("a", "b", suite="holdout"),
            ARMS,
            2,
        )
    started = [(h["x-reef-tag-eval-item"], h["x-reef-tag-eval-arm"]) for h in probe.calls]
    assert started == [
        (key, arm)
        for key in ("holdout/q0", "holdout/q1")
        for _ in range(2)
        for arm in ("candidate", "baseline")
    ]
    for headers in probe.calls:
        assert headers["authorization"] == "Bearer sk-x"
        assert headers["x-reef-scenario"] == "s"
        assert headers["x-reef-purpose"] == "eval"
        assert headers["x-reef-release"] == ARMS[headers["x-reef-tag-eval-arm"]]
    assert [a.record_id for a in answers] == [f"rec-{n}" for n in range(1, 9)]


async def test_429_is_retried_after_retry_after() -> None:
    async with Probe(refuse_first=2) as probe:
        patient = GatewayTarget(base_url=probe.url, scenario="s", retries=2)
        answers = await asyncio.to_thread(collect_answers, patient, items("a"), ARMS)
    assert [(a.text, a.attempts) for a in answers] == [("reef/s", 3), ("reef/s", 3)]


async def test_429_that_persists_is_a_rate_limited_answer() -> None:
    async with Probe(refuse_first=5) as probe:
        hasty = GatewayTarget(base_url=probe.url, scenario="s", retries=1)
        [answer] = await asyncio.to_thread(collect_answers, hasty, items("a"), {"candidate": "c"})
    assert answer.text is None and answer.attempts == 2
    assert answer.error == "gateway answered 429: slow down (after 2 attempts)"
    assert answer.error_kind == "rate_limited"


async def test_a_reply_that_is_no_completion_is_an_unreadable_answer() -> None:
    async with Probe(unreadable=True) as probe:
        target_ = GatewayTarget(base_url=probe.url, scenario="s", retries=2)
        [answer] = await asyncio.to_thread(collect_answers, target_, items("a"), {"baseline": "b"})
    assert answer.text is None and answer.attempts == 1  # not asked again
    assert answer.error == "unreadable reply: the reply has no choices"
    assert answer.error_kind == "unreadable"


async def test_silent_gateway_gives_timeout_answers() -> None:
    async with Probe(silent=True) as probe:
        hasty = GatewayTarget(base_url=probe.url, scenario="s", timeout_seconds=0.2, retries=0)
        answers: list[Answer] = await asyncio.to_thread(
            collect_answers,
            hasty,
            items("a"),
            {"candidate": "c"},
        )
    [answer] = answers
    assert answer.text is None and answer.error == "no reply within 0.2 s"
    assert answer.error_kind == "timeout"


def test_unreachable_gateway_gives_error_answers() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        nowhere = GatewayTarget(base_url=f"http://127.0.0.1:{port}", scenario="s", retries=0)
        [answer] = collect_answers(nowhere, items("a"), {"baseline": "b"})
    assert answer.text is None
    assert answer.error is not None and "could not reach the gateway" in answer.error
    assert answer.error_kind == "unreachable"


# -- pieces ---------------------------------------------------------------------------


class RecordedSleep:
    """The waits between a call and its retry, recorded instead of slept."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.mark.parametrize(
    ("retry_after", "waits"),
    [
        ("3", [3.0, 3.0]),
        ("60", [10.0, 10.0]),  # honoured up to ten seconds
        # an HTTP-date an hour away: read as a date, then capped like any hint
        (email.utils.formatdate(time.time() + 3600, usegmt=True), [10.0, 10.0]),
    ],
)
async def test_retry_after_in_seconds_or_as_a_date_sets_the_wait(
    retry_after: str, waits: list[float]
) -> None:
    sleep = RecordedSleep()
    async with Probe(refuse_first=2, retry_after=retry_after) as probe:
        patient = GatewayTarget(base_url=probe.url, scenario="s", retries=2, sleep=sleep)
        [answer] = await asyncio.to_thread(collect_answers, patient, items("a"), {"baseline": "b"})
    assert (answer.text, answer.attempts) == ("reef/s", 3)
    assert sleep.waits == waits


async def test_without_retry_after_the_backoff_doubles_below_five_seconds() -> None:
    sleep = RecordedSleep()
    async with Probe(refuse_first=9, retry_after="") as probe:
        hasty = GatewayTarget(base_url=probe.url, scenario="s", retries=6, sleep=sleep)
        [answer] = await asyncio.to_thread(collect_answers, hasty, items("a"), {"baseline": "b"})
    assert answer.attempts == 7 and answer.error_kind == "rate_limited"
    ceilings = [0.2, 0.4, 0.8, 1.6, 3.2, 5.0]
    assert len(sleep.waits) == len(ceilings)
    assert all(0 <= w <= c for w, c in zip(sleep.waits, ceilings, strict=True)), sleep.waits


def test_reply_text_reads_content_and_tool_calls() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert reply_text({"choices": [{"message": {"content": "hi"}}]}) == "hi"
    assert reply_text({"choices": [{"message": {"content": None}}]}) == ""
    assert '"name": "f"' in reply_text({"choices": [{"message": {"tool_calls": [call]}}]})
    with pytest.raises(ValueError):
        reply_text({"choices": []})


def test_bad_arguments_are_refused() -> None:
    somewhere = GatewayTarget(base_url="http://127.0.0.1:1", scenario="s")
    with pytest.raises(ValueError):
        collect_answers(somewhere, items("a"), {"control": "x"})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        collect_answers(somewhere, items("a"), {"baseline": "x"}, repeats=0)
    with pytest.raises(ValueError):
        GatewayTarget(base_url="http://x", scenario="s", concurrency=0)
    assert collect_answers(somewhere, [], {"baseline": "x"}) == []

"""A live canary on a real gateway, with the official OpenAI SDK in front of the fake
upstream: live traffic splits by session between the head and the canary (whose harness
really reaches the upstream), eval and pinned traffic is never re-routed, and once the
canary ends (abandoned or published) the head serves everything again.

Activation is driven by ``sync_once(wait=True)`` on the gateway's own loop (the poller is
parked at a one-hour interval), so nothing here waits on time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.harness import Bundle, Harness, pack_bundle
from reef.releases import (
    Candidate,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    open_artifact_store,
)
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call

SCENARIO = "agent"
SESSIONS = [f"conversation-{n}" for n in range(60)]
CANARY_PROMPT = "You are the canary arm of this agent."


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread() as server:
        yield server


@pytest.fixture
def gateway(tmp_path: Path, fake: FakeUpstreamThread) -> Iterator[GatewayThread]:
    settings = make_settings(
        tmp_path,
        fake.base_url,
        scenarios={SCENARIO: {"upstream": "fake", "harness": "managed"}},
        activation={"poll_interval_seconds": 3600},
    )
    with GatewayThread(settings) as running:
        yield running


def sync(gateway: GatewayThread) -> None:
    """One activation pass on the gateway's loop, staging awaited."""
    activation = gateway.app.state.reef.activation
    loop = gateway.server.servers[0].get_loop()
    asyncio.run_coroutine_threadsafe(activation.sync_once(wait=True), loop).result(timeout=30)


def canary_status(gateway: GatewayThread) -> Any:
    status = call(gateway.port, "GET", "/reef/status").json()
    return status["scenarios"][SCENARIO]["canary"]


def passed_candidate(gateway: GatewayThread, head: Release, manifest: ReleaseManifest) -> Candidate:
    chain = ReleaseChain(gateway.database)
    candidate = chain.propose(SCENARIO, manifest, head.id, "test", "canary test")
    chain.set_candidate_state(candidate.id, "evaluating")
    return chain.set_candidate_state(candidate.id, "passed", evidence={"win_rate": 0.8})


def canary_manifest(gateway: GatewayThread) -> ReleaseManifest:
    """A manifest whose harness adds ``CANARY_PROMPT`` as the system prompt."""
    bundle = Bundle(harness=Harness(schema_version=1, system_prompt=CANARY_PROMPT))
    digest = open_artifact_store(gateway.settings.artifacts_url()).put_bytes(
        pack_bundle(bundle), "harness"
    )
    return ReleaseManifest(model=ModelComponent(base="fake-model"), harness=digest)


def start_harness_canary(gateway: GatewayThread, fraction: float) -> tuple[Release, Candidate]:
    """The head (no harness) and a live canary whose harness adds a system prompt."""
    chain = ReleaseChain(gateway.database)
    head = chain.head(SCENARIO)
    assert head is not None
    manifest = canary_manifest(gateway)
    candidate = passed_candidate(gateway, head, manifest)
    return head, chain.start_canary(candidate.id, fraction, "test", "live comparison")


def ask(
    gateway: GatewayThread, text: str, session: str | None = None, **headers: str
) -> dict[str, Any]:
    """One chat completion: which release served it, as the client and the record see it."""
    if session is not None:
        headers["x-reef-session"] = session
    raw = gateway.openai(**headers).chat.completions.with_raw_response.create(
        model=f"reef/{SCENARIO}", messages=[{"role": "user", "content": text}]
    )
    completion = raw.parse()
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.release_id == raw.headers["x-reef-release-id"]
    assert completion.choices[0].message.content == f"echo: {text}"
    assert completion.usage is not None
    rendered = record.rendered_request
    return {
        "release": raw.headers["x-reef-release-id"],
        "purpose": record.purpose,
        "session": raw.headers["x-reef-session-id"],
        # the canary's system prompt reached the upstream: it counts the words it got
        "prompt_tokens": completion.usage.prompt_tokens,
        "system": None if rendered is None else rendered["messages"][0]["content"],
    }


def check_arms(served: list[dict[str, Any]], head: Release, canary: Candidate) -> None:
    """Every answer came from one arm, served and recorded consistently."""
    for answer in served:
        if answer["release"] == canary.id:
            assert answer["purpose"] == "canary"
            assert answer["system"] is not None and CANARY_PROMPT in answer["system"]
            assert answer["prompt_tokens"] == 2 + len(CANARY_PROMPT.split())
        else:
            assert (answer["release"], answer["purpose"]) == (head.id, "serve")
            assert answer["system"] is None and answer["prompt_tokens"] == 2


def test_live_traffic_splits_by_session_until_the_canary_is_abandoned(
    gateway: GatewayThread,
) -> None:
    head, canary = start_harness_canary(gateway, 0.5)
    sync(gateway)
    status = canary_status(gateway)
    assert (status["candidate_id"], status["fraction"], status["state"]) == (
        canary.id,
        0.5,
        "serving",
    )

    first = {s: ask(gateway, f"hello {n}", s) for n, s in enumerate(SESSIONS)}
    check_arms(list(first.values()), head, canary)
    arms = {s: answer["release"] for s, answer in first.items()}
    on_canary = [s for s, release in arms.items() if release == canary.id]
    on_head = [s for s, release in arms.items() if release == head.id]
    assert on_canary and on_head  # 60 sessions at 0.5: both arms serve

    # the same session always lands on the same arm
    again = {s: ask(gateway, f"again {n}", s) for n, s in enumerate(SESSIONS)}
    check_arms(list(again.values()), head, canary)
    assert {s: answer["release"] for s, answer in again.items()} == arms

    # eval traffic and pinned requests are never re-routed
    for session in on_canary[:5]:
        evaluated = ask(gateway, "graded", session, **{"x-reef-purpose": "eval"})
        assert (evaluated["release"], evaluated["purpose"]) == (head.id, "eval")
        pinned = ask(gateway, "pinned", session, **{"x-reef-release": head.id})
        assert (pinned["release"], pinned["purpose"]) == (head.id, "serve")
    for session in on_head[:5]:
        pinned = ask(gateway, "pinned", session, **{"x-reef-release": canary.id})
        assert (pinned["release"], pinned["purpose"]) == (canary.id, "serve")

    # without a session header the arm is drawn per new conversation...
    fresh = [ask(gateway, f"fresh {n}") for n in range(40)]
    check_arms(fresh, head, canary)
    assert {answer["release"] for answer in fresh} == {head.id, canary.id}
    # ...and an inferred continuation stays on its conversation's arm
    for opening in fresh[:6]:
        text = f"fresh {fresh.index(opening)}"
        messages = [
            {"role": "user", "content": text},
            {"role": "assistant", "content": f"echo: {text}"},
            {"role": "user", "content": "and then?"},
        ]
        raw = gateway.openai().chat.completions.with_raw_response.create(
            model=f"reef/{SCENARIO}", messages=messages
        )
        assert raw.headers["x-reef-session-id"] == opening["session"]
        assert raw.headers["x-reef-release-id"] == opening["release"]

    # streaming responses name the canary too
    stream = gateway.openai(**{"x-reef-session": on_canary[0]}).chat.completions
    with stream.with_streaming_response.create(
        model=f"reef/{SCENARIO}",
        messages=[{"role": "user", "content": "streamed"}],
        stream=True,
    ) as response:
        assert response.headers["x-reef-release-id"] == canary.id
        assert "".join(response.iter_lines())  # read to the end: the record is committed
    streamed = gateway.store.get_record(response.headers["x-reef-record-id"])
    assert (streamed.release_id, streamed.purpose) == (canary.id, "canary")

    ReleaseChain(gateway.database).set_candidate_state(canary.id, "abandoned")
    sync(gateway)
    assert canary_status(gateway) is None
    after = [ask(gateway, f"after {n}", s) for n, s in enumerate(SESSIONS)]
    assert {(a["release"], a["purpose"]) for a in after} == {(head.id, "serve")}


def test_a_published_canary_becomes_the_head_that_serves_everyone(
    gateway: GatewayThread,
) -> None:
    head, canary = start_harness_canary(gateway, 0.3)
    sync(gateway)
    check_arms([ask(gateway, f"before {n}", s) for n, s in enumerate(SESSIONS[:20])], head, canary)
    release = ReleaseChain(gateway.database).publish(canary.id, head.id, "monitor", "won")
    sync(gateway)
    status = call(gateway.port, "GET", "/reef/status").json()["scenarios"][SCENARIO]
    assert (status["serving_release_id"], status["canary"]) == (release.id, None)
    after = [ask(gateway, f"after {n}", s) for n, s in enumerate(SESSIONS)]
    assert {(a["release"], a["purpose"]) for a in after} == {(release.id, "serve")}
    assert all(a["system"] is not None and CANARY_PROMPT in a["system"] for a in after)


def test_a_canary_that_fails_to_stage_leaves_all_traffic_to_the_head(
    gateway: GatewayThread, tmp_path: Path
) -> None:
    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    (adapter_dir / "adapter_config.json").write_text("{}")
    (adapter_dir / "adapter_model.safetensors").write_bytes(b"not really weights")
    chain = ReleaseChain(gateway.database)
    head = chain.head(SCENARIO)
    assert head is not None
    # the fake upstream has no adapter API: loading the canary's adapter fails
    digest = open_artifact_store(gateway.settings.artifacts_url()).put_dir(adapter_dir, "adapter")
    manifest = ReleaseManifest(model=ModelComponent(base="fake-model", adapter=digest))
    canary = chain.start_canary(passed_candidate(gateway, head, manifest).id, 0.9, "t", "r")
    sync(gateway)
    status = call(gateway.port, "GET", "/reef/status").json()
    assert status["canary_failures_total"] == 1
    failed = status["scenarios"][SCENARIO]["canary"]
    assert (failed["candidate_id"], failed["state"], failed["failures"]) == (
        canary.id,
        "failed",
        1,
    )
    assert failed["error"]
    served = [ask(gateway, f"hello {n}", s) for n, s in enumerate(SESSIONS[:20])]
    assert {(a["release"], a["purpose"]) for a in served} == {(head.id, "serve")}
    chain.set_candidate_state(canary.id, "abandoned")
    sync(gateway)
    assert canary_status(gateway) is None


def test_a_waiting_sync_waits_for_a_staging_already_under_way(gateway: GatewayThread) -> None:
    """A rollback or publish route stages the new head and answers once it serves. When
    the poller has begun staging (that head, or one before it), the route's waiting sync
    must wait for it and then stage the head as it is, not answer while the old release
    still serves (seen: a rollback answered 201 while the harness route still served the
    release rolled back from)."""
    sync(gateway)  # the initial head serves
    chain = ReleaseChain(gateway.database)
    head = chain.head(SCENARIO)
    assert head is not None
    manifest = canary_manifest(gateway)
    new = chain.publish(passed_candidate(gateway, head, manifest).id, head.id, "test", "new")
    activation = gateway.app.state.reef.activation

    async def poller_then_route() -> str | None:
        await activation.sync_once()  # the poller: staging starts, nobody waits
        await activation.sync_once(wait=True, only=SCENARIO)  # the route's
        return activation.serving[SCENARIO].release_id

    loop = gateway.server.servers[0].get_loop()
    served = asyncio.run_coroutine_threadsafe(poller_then_route(), loop).result(timeout=30)
    assert served == new.id

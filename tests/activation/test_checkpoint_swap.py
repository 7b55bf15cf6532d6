"""Checkpoints through a real gateway on the embedded engine: a candidate's checkpoint
is served pinned and as a live canary beside the head's weights; publishing flips the
head onto it and unloads the weights nothing serves any more (``max_checkpoints``: 1);
a rollback loads the earlier checkpoint again; a pin whose checkpoint was unloaded
stages it again; an adapter on top of a checkpoint fails to stage with a clear error.

Activation is driven by ``sync_once(wait=True)`` on the gateway's loop (the poller is
parked), so nothing waits on time except the engine freeing drained weights."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.engine.models import load_model
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from reef.releases import (
    Candidate,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    open_artifact_store,
)
from tests.engine.checkpoint_factory import make_letter_checkpoint
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.polling import eventually

SCENARIO = "s"
TINY = "tiny-random"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[GatewayThread, BackgroundServer, dict[str, str]]]:
    engine = BackgroundServer(Engine(load_model(TINY, tmp_path), max_batch=8, threads=1))
    engine.start()
    settings = make_settings(
        tmp_path,
        engine.base_url,
        upstreams={"engine": {"type": "openai", "base_url": engine.base_url, "model": TINY}},
        scenarios={SCENARIO: {"upstream": "engine"}},
        activation={"poll_interval_seconds": 3600, "max_checkpoints": 1},
    )
    store = open_artifact_store(settings.artifacts_url())
    digests = {
        letter: store.put_dir(
            make_letter_checkpoint(tmp_path / "ck" / letter, letter), "checkpoint"
        )
        for letter in "abc"
    }
    try:
        with GatewayThread(settings) as gateway:
            yield gateway, engine, digests
    finally:
        engine.stop()


def sync(gateway: GatewayThread) -> None:
    activation = gateway.app.state.reef.activation
    loop = gateway.server.servers[0].get_loop()
    asyncio.run_coroutine_threadsafe(activation.sync_once(wait=True), loop).result(timeout=60)


def ask(gateway: GatewayThread, **headers: str) -> tuple[str, str]:
    """(release that served, its answer) for one greedy request."""
    raw = gateway.openai(
        **{"x-reef-scenario": SCENARIO, **headers}
    ).chat.completions.with_raw_response.create(
        model=f"reef/{SCENARIO}",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
    )
    return raw.headers["x-reef-release-id"], raw.parse().choices[0].message.content or ""


def candidate(gateway: GatewayThread, head: Release, model: ModelComponent) -> Candidate:
    chain = ReleaseChain(gateway.database)
    proposed = chain.propose(SCENARIO, ReleaseManifest(model=model), head.id, "test", "test")
    chain.set_candidate_state(proposed.id, "evaluating")
    return chain.set_candidate_state(proposed.id, "passed", evidence={"win_rate": 1.0})


def status(gateway: GatewayThread) -> Any:
    return call(gateway.port, "GET", "/reef/status").json()


def test_pin_canary_publish_rollback_and_free(
    world: tuple[GatewayThread, BackgroundServer, dict[str, str]],
) -> None:
    gateway, engine, digests = world
    chain = ReleaseChain(gateway.database)
    ask(gateway)  # the scenario's first release: the base weights
    base = chain.head(SCENARIO)
    assert base is not None
    base_answer = ask(gateway)[1]
    assert base_answer not in ("aaaa", "bbbb")

    # A: published; the head serves checkpoint a
    first = candidate(gateway, base, ModelComponent(base=TINY, checkpoint=digests["a"]))
    released_a = chain.publish(first.id, base.id, "test", "a")
    sync(gateway)
    assert ask(gateway) == (released_a.id, "aaaa")

    # B: served pinned beside A, then as a live canary, then published
    second = candidate(gateway, released_a, ModelComponent(base=TINY, checkpoint=digests["b"]))
    assert ask(gateway, **{"x-reef-release": second.id}) == (second.id, "bbbb")
    assert ask(gateway) == (released_a.id, "aaaa")
    chain.start_canary(second.id, 0.5, "test", "live")
    sync(gateway)
    answers = {ask(gateway, **{"x-reef-session": f"c{n}"}) for n in range(16)}
    assert answers == {(released_a.id, "aaaa"), (second.id, "bbbb")}
    released_b = chain.publish(second.id, released_a.id, "test", "b")
    sync(gateway)
    assert ask(gateway) == (released_b.id, "bbbb")
    name_b = f"{SCENARIO}@ckpt-{digests['b'].removeprefix('sha256:')[:12]}"
    assert list(status(gateway)["checkpoints"]["engine"]) == [name_b]
    eventually(lambda: engine.engine.scheduler.stats()["weights"] == 2, "a's weights freed")

    # a rollback to A loads checkpoint a again and lets b go
    rolled = chain.rollback(SCENARIO, released_a.id, released_b.id, "test", "back to a")
    sync(gateway)
    assert ask(gateway) == (rolled.id, "aaaa")
    eventually(lambda: engine.engine.scheduler.stats()["weights"] == 2, "b's weights freed")
    # the pinned B had its checkpoint unloaded: pinning it again stages it again
    assert ask(gateway, **{"x-reef-release": released_b.id}) == (released_b.id, "bbbb")

    # and back to the base weights
    chain.rollback(SCENARIO, base.id, rolled.id, "test", "back to the base")
    sync(gateway)
    assert ask(gateway)[1] == base_answer


def test_an_adapter_on_a_checkpoint_does_not_stage_yet(
    world: tuple[GatewayThread, BackgroundServer, dict[str, str]],
) -> None:
    gateway, _engine, digests = world
    chain = ReleaseChain(gateway.database)
    ask(gateway)
    base = chain.head(SCENARIO)
    assert base is not None
    both = ModelComponent(base=TINY, checkpoint=digests["a"], adapter="sha256:" + "0" * 64)
    published = chain.publish(candidate(gateway, base, both).id, base.id, "test", "both")
    sync(gateway)
    state = status(gateway)["scenarios"][SCENARIO]
    assert state["state"] == "failed" and "adapter on top of a checkpoint" in state["error"]
    assert state["serving_release_id"] == base.id  # the previous release keeps serving
    assert ask(gateway)[0] == base.id
    assert published.id != base.id

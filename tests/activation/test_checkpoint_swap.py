"""Checkpoints through a real gateway on the embedded engine: a candidate's checkpoint
is served pinned and as a live canary beside the head's weights; publishing flips the
head onto it and unloads the weights nothing serves any more (``max_checkpoints``: 1);
a rollback loads the earlier checkpoint again; a pin whose checkpoint was unloaded
stages it again; an adapter on top of a checkpoint serves on that checkpoint's weights.

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
from tests.engine.checkpoint_factory import make_letter_checkpoint, make_noisy_checkpoint
from tests.engine.lora_factory import PEFT_WRAP_WARNING, make_random_adapter
from tests.engine.test_checkpoints import greedy_reference
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


@pytest.mark.filterwarnings(PEFT_WRAP_WARNING)
def test_an_adapter_on_a_checkpoint_serves_on_its_weights(
    world: tuple[GatewayThread, BackgroundServer, dict[str, str]], tmp_path: Path
) -> None:
    gateway, engine, digests = world
    chain = ReleaseChain(gateway.database)
    store = open_artifact_store(gateway.settings.artifacts_url())
    checkpoint = make_noisy_checkpoint(tmp_path / "noisy", seed=3)
    adapter = make_random_adapter(tmp_path / "lora", seed=5)
    hi = [{"role": "user", "content": "hi"}]
    expected = greedy_reference(checkpoint, adapter, tmp_path, hi, 4)
    alone = greedy_reference(checkpoint, None, tmp_path, hi, 4)
    assert expected != alone
    ask(gateway)
    base = chain.head(SCENARIO)
    assert base is not None
    both = ModelComponent(
        base=TINY,
        checkpoint=store.put_dir(checkpoint, "checkpoint"),
        adapter=store.put_dir(adapter, "adapter"),
    )
    published = chain.publish(candidate(gateway, base, both).id, base.id, "test", "both")
    sync(gateway)
    state = status(gateway)["scenarios"][SCENARIO]
    assert state["state"] == "serving" and state["serving_release_id"] == published.id
    assert ask(gateway) == (published.id, expected)
    assert engine.engine.scheduler.stats()["weights"] == 2  # the base's and the checkpoint's
    cards = {card.id: card for card in gateway_models(engine)}
    on = [name for name in cards if name.endswith(f"@ckpt-{both.checkpoint[7:19]}")]
    assert len(on) == 2  # the checkpoint, and the adapter on it
    (adapter_name,) = [name for name in on if cards[name].model_extra["kind"] == "adapter"]
    (checkpoint_name,) = [name for name in on if name != adapter_name]
    assert cards[adapter_name].parent == checkpoint_name

    # another checkpoint takes the only slot (max_checkpoints: 1): the noisy one is
    # unloaded and the adapter on it with it, so its weights are freed
    only_a = ModelComponent(base=TINY, checkpoint=digests["a"])
    head = chain.head(SCENARIO)
    assert head is not None
    replaced = chain.publish(candidate(gateway, head, only_a).id, head.id, "test", "a")
    sync(gateway)
    assert ask(gateway) == (replaced.id, "aaaa")
    assert adapter_name not in {card.id for card in gateway_models(engine)}
    eventually(lambda: engine.engine.scheduler.stats()["weights"] == 2, "noisy weights freed")


def gateway_models(engine: BackgroundServer) -> list[Any]:
    """The engine's model cards (OpenAI SDK)."""
    import openai

    with openai.OpenAI(base_url=engine.base_url, api_key="unused", max_retries=0) as sdk:
        return list(sdk.models.list().data)

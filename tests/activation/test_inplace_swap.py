"""Checkpoints on an upstream that reloads its one set of weights in place
(``checkpoint_loading: vllm`` or ``sglang``), through a real gateway in front of the fake
upstream speaking vLLM's dev-mode routes (``/collective_rpc`` reload_weights,
``/reset_prefix_cache``) and SGLang's ``/update_weights_from_disk``.

What is checked: the gateway loads the head's weights when it starts serving; a published
checkpoint is reloaded from its verified directory in the artifact cache and its prefix
cache reset; a request in flight finishes on the weights it started with before the
reload (none is answered while the server reloads), and a request that arrives during
the swap waits and is served by the new release; a rollback reloads the base model from
the ``root`` ``/models`` gives; a pin to other weights is refused (409) and a checkpoint
canary fails to stage, leaving the head all the traffic; a server that refuses the
reload, or has no reload route, leaves the previous release serving, with the reason in
``/reef/status``.

Activation is driven by ``sync_once(wait=True)`` on the gateway's loop (the poller is
parked), so nothing here waits on time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from reef.evaluation.runner import EvalRunError, GatewayTarget, collect_answers
from reef.evaluation.values import EvalItem
from reef.releases import (
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    open_artifact_store,
)
from tests.activation.test_adapter_lease import _adapter as fake_adapter
from tests.activation.test_checkpoint_swap import SCENARIO, candidate, status
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.gateway.sdk_calls import turn
from tests.polling import eventually

HEADERS = {"x-reef-scenario": SCENARIO}


def _checkpoint(directory: Path, fill: float) -> Path:
    """A checkpoint directory the gateway's checks accept (config, one safetensors)."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": np.full((4, 4), fill, dtype=np.float32)}, str(directory / "model.safetensors"))
    return directory


@pytest.fixture
def world(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[GatewayThread, FakeUpstreamThread, dict[str, str]]]:
    how, options, *more = request.param
    activation = {"poll_interval_seconds": 3600, **(more[0] if more else {})}
    served = None if how == "vllm-without-dev-mode" else how
    how = how.removesuffix("-without-dev-mode")
    with FakeUpstreamThread(reloads=served, **options) as fake:
        upstream = {
            "type": "openai",
            "base_url": fake.base_url,
            "model": "fake-model",
            "checkpoint_loading": how,
            "read_timeout_seconds": 5,
            "total_timeout_seconds": 10,
        }
        if served is None:  # no reload routes, no root in /models: configured
            upstream["base_weights"] = "/srv/models/fake-base"
        settings = make_settings(
            tmp_path,
            fake.base_url,
            upstreams={"fake": upstream},
            scenarios={SCENARIO: {"upstream": "fake"}},
            activation=activation,
        )
        store = open_artifact_store(settings.artifacts_url())
        digests = {
            name: store.put_dir(_checkpoint(tmp_path / "ck" / name, fill), "checkpoint")
            for name, fill in (("a", 1.0), ("b", 2.0))
        }
        with GatewayThread(settings) as gateway:
            yield gateway, fake, digests


def _sync(gateway: GatewayThread) -> Future[None]:
    activation = gateway.app.state.reef.activation
    loop = gateway.server.servers[0].get_loop()
    return asyncio.run_coroutine_threadsafe(activation.sync_once(wait=True), loop)


def _publish(gateway: GatewayThread, head: Release, model: ModelComponent) -> Release:
    chain = ReleaseChain(gateway.database)
    proposed = candidate(gateway, head, model)
    return chain.publish(proposed.id, head.id, "test", "test")


def _serving_base(gateway: GatewayThread) -> Release:
    """Serve the scenario once (its first release, on the base weights); that release."""
    assert turn(gateway.openai(), "start", stream=False, headers=HEADERS).status == 200
    base = ReleaseChain(gateway.database).head(SCENARIO)
    assert base is not None
    return base


def _weights_dir(gateway: GatewayThread, digest: str) -> str:
    return str(open_artifact_store(gateway.settings.artifacts_url()).materialize(digest))


def _answered_by(text: str) -> str:
    """The weights' directory name in a fake answer ``echo[<name>]: ...``."""
    assert text.startswith("echo["), text
    return text[5 : text.index("]")]


VLLM = ("vllm", {})


@pytest.mark.parametrize("world", [VLLM], indirect=True)
def test_publish_reloads_in_place_and_rollback_returns_to_the_base(
    world: tuple[GatewayThread, FakeUpstreamThread, dict[str, str]],
) -> None:
    gateway, fake, digests = world
    client = gateway.openai()
    first = turn(client, "hello", stream=False, headers=HEADERS)
    assert first.status == 200 and _answered_by(first.text) == "fake-base"
    # serving began by loading the head's weights: the server may hold any
    assert fake.server.reloaded == ["/srv/models/fake-base"]
    chain = ReleaseChain(gateway.database)
    base = chain.head(SCENARIO)
    assert base is not None

    model_a = ModelComponent(base="fake-model", checkpoint=digests["a"])
    released_a = _publish(gateway, base, model_a)
    _sync(gateway).result(timeout=30)
    directory_a = _weights_dir(gateway, digests["a"])
    assert fake.server.reloaded[-1] == directory_a
    assert fake.server.prefix_resets == 2  # after each reload
    assert fake.server.in_flight_at_reload == [0, 0]
    for stream in (False, True):
        reply = turn(client, "on a", stream=stream, headers=HEADERS)
        assert reply.status == 200 and reply.release == released_a.id
        assert _answered_by(reply.text) == Path(directory_a).name
    # the model sent upstream is the server's one name, not a checkpoint's
    assert fake.last_request_body["model"] == "fake-model"

    # a pin to the base's weights would move everyone's: refused, and says why
    pinned = call(
        gateway.port,
        "POST",
        "/v1/chat/completions",
        {"model": "reef/s", "messages": [{"role": "user", "content": "hi"}]},
        {**HEADERS, "x-reef-release": base.id},
    )
    assert pinned.status == 409
    message = pinned.json()["error"]["message"]
    assert "in place" in message and "the base model" in message
    # a pin to the head is served
    reply = turn(
        client, "pinned", stream=False, headers={**HEADERS, "x-reef-release": released_a.id}
    )
    assert reply.status == 200 and reply.release == released_a.id

    # a checkpoint canary cannot run beside the head here: it fails to stage
    canary = candidate(
        gateway, released_a, ModelComponent(base="fake-model", checkpoint=digests["b"])
    )
    chain.start_canary(canary.id, 0.5, "test", "live")
    _sync(gateway).result(timeout=30)
    state = status(gateway)["scenarios"][SCENARIO]["canary"]
    assert state["state"] == "failed" and "cannot be canaried" in state["error"]
    replies = [
        turn(client, f"c{n}", stream=False, headers={**HEADERS, "x-reef-session": f"c{n}"})
        for n in range(6)
    ]
    assert {r.release for r in replies} == {released_a.id}
    assert len(fake.server.reloaded) == 2  # nothing reloaded for the canary or the pin
    chain.set_candidate_state(canary.id, "abandoned")

    # a rollback to the base release reloads the base model's directory
    rolled = chain.rollback(SCENARIO, base.id, released_a.id, "test", "back")
    _sync(gateway).result(timeout=30)
    assert fake.server.reloaded[-1] == "/srv/models/fake-base"
    reply = turn(client, "back", stream=False, headers=HEADERS)
    assert reply.status == 200 and reply.release == rolled.id
    assert _answered_by(reply.text) == "fake-base"
    shown = subprocess.run(
        [sys.executable, "-m", "reef", "status", "--url", gateway.url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=gateway.settings.home.parent,
    )
    assert shown.returncode == 0, shown.stderr
    assert "in place (fake): holds the base model, 0 in flight, 0 waiting, 3 reloads" in (
        shown.stdout
    )
    in_place = status(gateway)["in_place"]["fake"]
    assert in_place == {
        "resident": "base",
        "in_flight": 0,
        "swapping": False,
        "waiting": 0,
        "reloads": 3,
    }


@pytest.mark.parametrize("world", [VLLM], indirect=True)
def test_a_swap_drains_requests_in_flight_and_holds_new_ones(
    world: tuple[GatewayThread, FakeUpstreamThread, dict[str, str]],
) -> None:
    gateway, fake, digests = world
    client = gateway.openai()
    base = _serving_base(gateway)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # a stream the upstream holds before it answers
        in_flight = pool.submit(turn, client, "hold-answer old", stream=True, headers=HEADERS)
        eventually(lambda: fake.held == 1, "the stream at the upstream")
        released = _publish(
            gateway, base, ModelComponent(base="fake-model", checkpoint=digests["a"])
        )
        swap = _sync(gateway)
        eventually(lambda: status(gateway)["in_place"]["fake"]["swapping"], "the swap to begin")
        # a request that arrives now waits at the gateway for the swap
        arriving = pool.submit(turn, client, "new", stream=False, headers=HEADERS)
        eventually(lambda: status(gateway)["in_place"]["fake"]["waiting"] == 1, "it to wait")
        assert len(fake.server.reloaded) == 1  # still draining: not reloaded
        fake.release_held()
        old, new = in_flight.result(timeout=30), arriving.result(timeout=30)
        swap.result(timeout=30)
    assert old.status == 200 and old.release == base.id
    assert _answered_by(old.text) == "fake-base"  # finished on the weights it began with
    assert new.status == 200 and new.release == released.id
    assert _answered_by(new.text) == Path(_weights_dir(gateway, digests["a"])).name
    assert fake.server.in_flight_at_reload == [0, 0]  # nothing answered while reloading


@pytest.mark.parametrize("world", [("vllm", {"adapters": True})], indirect=True)
def test_an_adapter_canary_on_the_serving_weights_runs_beside_the_head(
    world: tuple[GatewayThread, FakeUpstreamThread, dict[str, str]], tmp_path: Path
) -> None:
    gateway, fake, _digests = world
    client = gateway.openai()
    base = _serving_base(gateway)
    chain = ReleaseChain(gateway.database)
    store = open_artifact_store(gateway.settings.artifacts_url())
    digest = store.put_dir(fake_adapter(tmp_path), "adapter")
    canary = candidate(gateway, base, ModelComponent(base="fake-model", adapter=digest))
    chain.start_canary(canary.id, 0.5, "test", "live")
    _sync(gateway).result(timeout=30)
    assert status(gateway)["scenarios"][SCENARIO]["canary"]["state"] == "serving"
    replies = [
        turn(client, f"c{n}", stream=False, headers={**HEADERS, "x-reef-session": f"c{n}"})
        for n in range(16)
    ]
    assert {r.status for r in replies} == {200}
    assert {r.release for r in replies} == {base.id, canary.id}
    assert fake.server.reloaded == ["/srv/models/fake-base"]  # the weights never moved


@pytest.mark.parametrize("world", [("vllm", {}, {"stage_timeout_seconds": 1})], indirect=True)
def test_a_swap_that_outlasts_the_stage_timeout_reloads_nothing_and_says_why(
    world: tuple[GatewayThread, FakeUpstreamThread, dict[str, str]],
) -> None:
    gateway, fake, digests = world
    client = gateway.openai()
    base = _serving_base(gateway)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        long = pool.submit(turn, client, "hold-answer long", stream=True, headers=HEADERS)
        eventually(lambda: fake.held == 1, "the stream at the upstream")
        _publish(gateway, base, ModelComponent(base="fake-model", checkpoint=digests["a"]))
        _sync(gateway).result(timeout=30)  # gives up after 1 s of draining
        state = status(gateway)["scenarios"][SCENARIO]
        assert state["state"] == "failed" and state["serving_release_id"] == base.id
        assert "stage_timeout_seconds (1 s)" in state["error"]
        assert "1 request(s) were still running" in state["error"]
        assert status(gateway)["in_place"]["fake"]["swapping"] is False
        fake.release_held()
        assert long.result(timeout=30).status == 200
    reply = turn(client, "after", stream=False, headers=HEADERS)
    assert reply.status == 200 and reply.release == base.id
    assert fake.server.reloaded == ["/srv/models/fake-base"]


@pytest.mark.parametrize("world", [("sglang", {"refuse_reload": True})], indirect=True)
def test_a_refused_reload_leaves_the_previous_release_serving(
    world: tuple[GatewayThread, FakeUpstreamThread, dict[str, str]],
) -> None:
    gateway, fake, digests = world
    client = gateway.openai()
    assert _answered_by(turn(client, "start", stream=False, headers=HEADERS).text) == "fake-base"
    assert fake.requests_received("/update_weights_from_disk") == 1  # the base, at start
    chain = ReleaseChain(gateway.database)
    base = chain.head(SCENARIO)
    assert base is not None
    _publish(gateway, base, ModelComponent(base="fake-model", checkpoint=digests["a"]))
    _sync(gateway).result(timeout=30)
    state = status(gateway)["scenarios"][SCENARIO]
    assert state["state"] == "failed" and state["serving_release_id"] == base.id
    assert "shape mismatch" in state["error"]
    reply = turn(client, "still", stream=False, headers=HEADERS)
    assert reply.status == 200 and reply.release == base.id
    assert _answered_by(reply.text) == "fake-base"
    # the gateway cannot tell what a refused reload left in place: it reloaded the
    # serving weights before sending that request
    assert fake.server.reloaded == ["/srv/models/fake-base", "/srv/models/fake-base"]


@pytest.mark.parametrize("world", [("vllm-without-dev-mode", {})], indirect=True)
def test_a_vllm_without_its_reload_route_fails_requests_with_the_fix(
    world: tuple[GatewayThread, FakeUpstreamThread, dict[str, str]],
) -> None:
    """Serving cannot confirm which weights the server holds, so no request is sent."""
    gateway, fake, _digests = world
    reply = call(
        gateway.port,
        "POST",
        "/v1/chat/completions",
        {"model": "reef/s", "messages": [{"role": "user", "content": "hi"}]},
        HEADERS,
    )
    assert reply.status == 502
    assert "VLLM_SERVER_DEV_MODE=1" in reply.json()["error"]["message"]
    assert fake.requests_received("/v1/chat/completions") == 0
    state = status(gateway)["scenarios"][SCENARIO]
    assert state["state"] == "failed" and "/collective_rpc" in state["error"]


@pytest.mark.parametrize("world", [VLLM], indirect=True)
def test_the_gate_cannot_evaluate_a_checkpoint_here_and_says_why(
    world: tuple[GatewayThread, FakeUpstreamThread, dict[str, str]],
) -> None:
    """The gate pins both arms: a checkpoint candidate's arm is refused, which voids the
    run (not 10 failed items that would read as a worse candidate)."""
    gateway, fake, digests = world
    base = _serving_base(gateway)
    checkpoint = ModelComponent(base="fake-model", checkpoint=digests["a"])
    proposed = ReleaseChain(gateway.database).propose(
        SCENARIO, ReleaseManifest(model=checkpoint), base.id, "test", "full"
    )
    asked = [
        EvalItem(id=f"q{n}", suite="file:t", messages=[{"role": "user", "content": f"q{n}"}])
        for n in range(3)
    ]
    target = GatewayTarget(base_url=gateway.url, scenario=SCENARIO)
    with pytest.raises(EvalRunError) as refused:
        collect_answers(target, asked, {"candidate": proposed.id, "baseline": base.id})
    assert refused.value.status == 409 and refused.value.arm == "candidate"
    assert "in place" in refused.value.message
    assert fake.server.reloaded == ["/srv/models/fake-base"]  # serving never moved


def test_in_place_loading_needs_an_openai_upstream() -> None:
    from pydantic import ValidationError

    from reef.config.models import UpstreamConfig

    with pytest.raises(ValidationError, match="checkpoint_loading: vllm needs an upstream"):
        UpstreamConfig(type="anthropic", base_url="http://x/v1", checkpoint_loading="vllm")


def test_a_checkpoint_on_vllm_without_in_place_loading_says_what_to_set(tmp_path: Path) -> None:
    with FakeUpstreamThread() as fake:
        settings = make_settings(
            tmp_path,
            fake.base_url,
            scenarios={SCENARIO: {"upstream": "fake"}},
            activation={"poll_interval_seconds": 3600},
        )
        store = open_artifact_store(settings.artifacts_url())
        digest = store.put_dir(_checkpoint(tmp_path / "ck", 1.0), "checkpoint")
        with GatewayThread(settings) as gateway:
            base = _serving_base(gateway)
            _publish(gateway, base, ModelComponent(base="fake-model", checkpoint=digest))
            _sync(gateway).result(timeout=30)
            state = status(gateway)["scenarios"][SCENARIO]
            assert state["state"] == "failed" and state["serving_release_id"] == base.id
            assert "upstreams.fake.checkpoint_loading" in state["error"]
            reply = turn(gateway.openai(), "still", stream=False, headers=HEADERS)
            assert reply.status == 200 and reply.release == base.id

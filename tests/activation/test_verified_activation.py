"""Verified activation: an upstream that serves other weights under an adapter's name
fails staging with the first difference and the previous release serves on; an adapter
the upstream drops after the flip is found by the next verification and loaded again;
one dropped between its staging and the flip is found by the probe after the flip; a
gate run on a swapped candidate fails before any item counts; an adapter made before
fingerprints stages unverified; one whose fingerprint cannot tell it from the base model
at the tolerance used verifies with one warning saying so."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from reef.evaluation.config import GateConfig
from reef.evaluation.gate import Gate
from reef.evaluation.results import EvaluationStore
from reef.evaluation.runner import EvalRunError, GatewayTarget
from reef.experience import RecordNotFoundError
from reef.gateway.serving.activation import Activation
from reef.releases import (
    Fingerprint,
    FingerprintProbe,
    ModelComponent,
    ReleaseChain,
    ReleaseManifest,
    open_artifact_store,
)
from tests.fakes.fingerprinted import FingerprintedUpstream
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.polling import eventually

PROMPT = [{"role": "user", "content": "probe me"}]


def _adapter(directory: Path, tokens: list[int] | None, **base: Any) -> Path:
    """An adapter directory; with ``tokens``, fingerprinted as weights answering them
    (``base``: the fingerprint's dtype and base fields)."""
    directory.mkdir()
    (directory / "adapter_config.json").write_text("{}")
    (directory / "adapter_model.safetensors").write_bytes(directory.name.encode())
    if tokens is not None:
        _fingerprint(directory, tokens, **base)
    return directory


def _fingerprint(directory: Path, tokens: list[int], **base: Any) -> None:
    """Fingerprint ``directory`` as weights that answer ``tokens`` to the probe."""
    probe = FingerprintProbe(
        messages=PROMPT,
        tokens=tokens,
        text="".join(f"t{t}" for t in tokens),
        logprobs=[-0.25] * len(tokens),
        margins=[3.0] * len(tokens),
        ended=True,
    )
    fields = {"dtype": "float32", **base}
    Fingerprint(max_new_tokens=16, probes=[probe], **fields).write(directory)


def _status(gateway: GatewayThread) -> dict[str, Any]:
    state: dict[str, Any] = call(gateway.port, "GET", "/reef/status").json()
    return state


def _scenario(gateway: GatewayThread) -> dict[str, Any]:
    scenario: dict[str, Any] = _status(gateway)["scenarios"]["s"]
    return scenario


def _publish(gateway: GatewayThread, settings: Any, adapter: Path, parent: str) -> str:
    digest = open_artifact_store(settings.artifacts_url()).put_dir(adapter, "adapter")
    chain = ReleaseChain(gateway.database)
    manifest = ReleaseManifest(model=ModelComponent(base="fake-model", adapter=digest))
    candidate = chain.propose("s", manifest, parent, "test", "adapter")
    return chain.publish(candidate.id, parent, "test", "adapter", require_passed=False).id


def _tick(gateway: GatewayThread) -> None:
    """One continuous verification, run in the gateway's event loop (no interval waited)."""
    activation: Activation = gateway.app.state.reef.activation
    assert activation._poller is not None
    loop = activation._poller.get_loop()
    asyncio.run_coroutine_threadsafe(activation.verify_tick(), loop).result(timeout=30)


def _settings(tmp_path: Path, url: str, interval: float = 0) -> Any:
    return make_settings(
        tmp_path,
        url,
        scenarios={"s": {"upstream": "fake"}},
        activation={"poll_interval_seconds": 0.1, "verify_interval_seconds": interval},
    )


@contextmanager
def _serving(
    tmp_path: Path, interval: float = 0
) -> Iterator[tuple[FingerprintedUpstream, Any, GatewayThread, str]]:
    """The fingerprinted fake, the gateway's settings (``interval``: its
    ``verify_interval_seconds``, 0: off), the gateway in front of it, and the id of the
    release a first request was served by."""
    with FingerprintedUpstream() as fake:
        settings = _settings(tmp_path, fake.base_url, interval)
        with GatewayThread(settings) as gateway:
            base = (
                gateway.openai()
                .chat.completions.with_raw_response.create(
                    model="reef/s", messages=[{"role": "user", "content": "hi"}]
                )
                .headers["x-reef-release-id"]
            )
            yield fake, settings, gateway, base


def test_a_swapped_adapter_fails_staging_and_the_previous_release_serves(
    tmp_path: Path,
) -> None:
    good = _adapter(tmp_path / "good", [11, 12, 13])
    wanted = _adapter(tmp_path / "wanted", [21, 22, 23])
    other = _adapter(tmp_path / "other", [21, 22, 99])  # another digest's weights
    with _serving(tmp_path) as (fake, settings, gateway, base):
        client = gateway.openai()
        first = _publish(gateway, settings, good, base)
        eventually(lambda: _scenario(gateway)["serving_release_id"] == first, "good serves")
        assert _scenario(gateway)["verification"]["state"] == "verified"

        fake.impostor = other  # every load from now serves the other weights
        second = _publish(gateway, settings, wanted, first)
        failed = eventually(
            lambda: _scenario(gateway) if _scenario(gateway)["state"] == "failed" else None,
            "staging the swapped adapter to fail",
        )
        assert failed["head_release_id"] == second
        assert failed["serving_release_id"] == first
        assert "probe 0 differs at token 2: expected token 23, got token 99" in failed["error"]
        swapped = f"s@{_digest12(settings, wanted)}"
        assert swapped not in fake.adapters  # unloaded: nothing can reach it
        assert swapped not in _status(gateway)["adapters"]["fake"]

        after = client.chat.completions.with_raw_response.create(
            model="reef/s", messages=[{"role": "user", "content": "after"}]
        )
        assert after.headers["x-reef-release-id"] == first
        assert fake.last_model == f"s@{_digest12(settings, good)}"
        metrics = call(gateway.port, "GET", "/metrics").body.decode()
        assert "reef_activation_verify_failures_total 1.0" in metrics


def test_an_evicted_adapter_is_found_and_loaded_again(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path / "adapter", [31, 32])
    with _serving(tmp_path) as (fake, settings, gateway, base):
        client = gateway.openai()
        release = _publish(gateway, settings, adapter, base)
        eventually(lambda: _scenario(gateway)["serving_release_id"] == release, "it serves")
        name = f"s@{_digest12(settings, adapter)}"
        first = _scenario(gateway)["verification"]
        assert (first["weights"], first["state"]) == (name, "verified")
        assert fake.loads == 1

        _tick(gateway)  # nothing changed: verified again, nothing loaded
        assert fake.loads == 1

        fake.evict(name)  # vLLM's LRU: gone from /v1/models, base weights answer
        _tick(gateway)
        assert fake.loads == 2
        assert name in fake.adapters
        again = _scenario(gateway)["verification"]
        assert again["state"] == "verified"
        assert again["digest"] == _digest(settings, adapter)
        assert again["at"] >= first["at"]
        assert _stamp(gateway, client) == (release, _digest(settings, adapter))
        metrics = call(gateway.port, "GET", "/metrics").body.decode()
        assert "reef_activation_verify_restaged_total 1.0" in metrics
        assert _stamp(gateway, client) == (release, _digest(settings, adapter))

        fake.impostor = tmp_path / "adapter"  # loads work, but the adapter is evicted
        fake.evict(name)
        fake.impostor = _adapter(tmp_path / "wrong", [31, 40])
        _tick(gateway)  # re-staged onto wrong weights: an alert, the release stays
        state = _scenario(gateway)
        assert state["serving_release_id"] == release
        assert state["verification"]["state"] == "failed"
        assert "expected token 32, got token 40" in state["verification"]["diff"]
        assert _stamp(gateway, client) == (release, None)  # served, but not verified


def test_an_adapter_dropped_before_the_flip_is_found_by_the_probe_after_it(
    tmp_path: Path,
) -> None:
    """The upstream drops the adapter right after its staging's warm-up and probe (say,
    another load evicting it from vLLM's cache before the flip). With no interval
    (``verify_interval_seconds: 0``) the probe after the flip finds it gone, loads it
    again and verifies it; the release serves on, and its records carry the digest."""
    adapter = _adapter(tmp_path / "adapter", [51, 52])
    with _serving(tmp_path) as (fake, settings, gateway, base):
        name = f"s@{_digest12(settings, adapter)}"
        fake.evict_after(name, 2)  # its warm-up and its one probe, then gone
        release = _publish(gateway, settings, adapter, base)
        eventually(
            lambda: (
                "reef_activation_verify_restaged_total 1.0"
                in call(gateway.port, "GET", "/metrics").body.decode()
            ),
            "the adapter found gone after the flip and loaded again",
        )
        assert fake.loads == 2 and name in fake.adapters
        state = _scenario(gateway)
        assert state["serving_release_id"] == release and state["state"] == "serving"
        assert (state["verification"]["weights"], state["verification"]["state"]) == (
            name,
            "verified",
        )
        assert _stamp(gateway, gateway.openai()) == (release, _digest(settings, adapter))


def test_the_interval_finds_an_evicted_adapter_on_its_own(tmp_path: Path) -> None:
    """``activation.verify_interval_seconds`` runs the re-probe by itself: an adapter
    the upstream drops while it serves is loaded again and verified, nobody calling."""
    adapter = _adapter(tmp_path / "adapter", [71, 72])
    with _serving(tmp_path, interval=0.2) as (fake, settings, gateway, base):
        release = _publish(gateway, settings, adapter, base)
        eventually(lambda: _scenario(gateway)["serving_release_id"] == release, "it serves")
        name = f"s@{_digest12(settings, adapter)}"
        loads = fake.loads
        fake.evict(name)
        eventually(lambda: fake.loads > loads and name in fake.adapters, "loaded again")
        eventually(
            lambda: (
                "reef_activation_verify_restaged_total 1.0"
                in call(gateway.port, "GET", "/metrics").body.decode()
            ),
            "the re-stage counted",
        )
        assert _scenario(gateway)["verification"]["state"] == "verified"


def _stamp(gateway: GatewayThread, client: Any) -> tuple[str | None, str | None]:
    """The release and verified weights digest on the record of one new request."""
    raw = client.chat.completions.with_raw_response.create(
        model="reef/s", messages=[{"role": "user", "content": "stamp"}]
    )
    record = eventually(
        lambda: _record(gateway, raw.headers["x-reef-record-id"]), "the record to be written"
    )
    return record.release_id, record.weights_digest


def _record(gateway: GatewayThread, record_id: str) -> Any:
    try:
        return gateway.store.get_record(record_id)
    except RecordNotFoundError:
        return None


def test_an_adapter_without_a_fingerprint_stages_unverified(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path / "old", None)
    with _serving(tmp_path) as (_fake, settings, gateway, base):
        release = _publish(gateway, settings, adapter, base)
        eventually(lambda: _scenario(gateway)["serving_release_id"] == release, "it serves")
        assert _scenario(gateway)["verification"]["state"] == "unverified"


def test_a_fingerprint_that_cannot_tell_the_base_verifies_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="reef.gateway.serving.activation")
    # bfloat16 (tolerance 1.0): the base model's logprobs 0.31 away, its tokens the same
    small = _adapter(
        tmp_path / "small", [41, 42], dtype="bfloat16", base_gap=0.31, base_differs=False
    )
    with _serving(tmp_path) as (_fake, settings, gateway, base):
        release = _publish(gateway, settings, small, base)
        eventually(lambda: _scenario(gateway)["serving_release_id"] == release, "it serves")
        verification = _scenario(gateway)["verification"]
        assert verification["state"] == "verified"
        assert verification["distinguishes_base"] is False
        _tick(gateway)  # verified again: no second warning
        assert _scenario(gateway)["verification"]["distinguishes_base"] is False
    warnings = [r.getMessage() for r in caplog.records if "base model" in r.getMessage()]
    assert len(warnings) == 1
    assert f"s@{_digest12(settings, small)}" in warnings[0]
    assert (
        "at bfloat16 this fingerprint cannot tell the adapter from the base model: "
        "largest difference 0.31 ≤ tolerance 1" in warnings[0]
    )


def test_a_fingerprint_that_tells_the_base_apart_shows_it(tmp_path: Path) -> None:
    wide = _adapter(tmp_path / "wide", [51], dtype="bfloat16", base_gap=0.31, base_differs=True)
    with _serving(tmp_path) as (_fake, settings, gateway, base):
        release = _publish(gateway, settings, wide, base)
        eventually(lambda: _scenario(gateway)["serving_release_id"] == release, "it serves")
        assert _scenario(gateway)["verification"]["distinguishes_base"] is True


def _digest(settings: Any, adapter: Path) -> str:
    return open_artifact_store(settings.artifacts_url()).put_dir(adapter, "adapter")


def _digest12(settings: Any, adapter: Path) -> str:
    return _digest(settings, adapter).removeprefix("sha256:")[:12]


def test_the_gates_pin_of_a_swapped_candidate_is_refused_with_the_diff(tmp_path: Path) -> None:
    """The gate answers items pinned to the candidate (``x-reef-release``): staging the
    pin verifies it, so a candidate on other weights gets no answer that could count."""
    wanted = _adapter(tmp_path / "wanted", [41, 42])
    with _serving(tmp_path) as (fake, settings, gateway, base):
        digest = open_artifact_store(settings.artifacts_url()).put_dir(wanted, "adapter")
        chain = ReleaseChain(gateway.database)
        manifest = ReleaseManifest(model=ModelComponent(base="fake-model", adapter=digest))
        candidate = chain.propose("s", manifest, base, "test", "swapped")
        chain.set_candidate_state(candidate.id, "evaluating")
        fake.impostor = _adapter(tmp_path / "other", [41, 43])
        body = {"model": "reef/s", "messages": [{"role": "user", "content": "item 1"}]}
        answer = call(
            gateway.port, "POST", "/v1/chat/completions", body, {"x-reef-release": candidate.id}
        )
        assert answer.status == 409, answer.body
        assert b"expected token 42, got token 43" in answer.body
        assert f"s@{digest.removeprefix('sha256:')[:12]}" not in fake.adapters


def test_a_gate_run_on_a_swapped_candidate_fails_before_any_item_counts(tmp_path: Path) -> None:
    """The gate itself (``Gate.run``): its candidate arm's pin stages the candidate and
    verifies it, the gateway refuses it with the diff, and the run fails with no item
    answered or scored; the candidate is neither rejected nor published."""
    (tmp_path / "quiz.jsonl").write_text(
        "".join(json.dumps({"id": f"q{n}", "input": f"q {n}", "reference": "x"}) + "\n"
                for n in range(3))
    )  # fmt: skip
    wanted = _adapter(tmp_path / "wanted", [61, 62])
    with _serving(tmp_path) as (fake, settings, gateway, base):
        artifacts = open_artifact_store(settings.artifacts_url())
        chain = ReleaseChain(gateway.database)
        manifest = ReleaseManifest(
            model=ModelComponent(base="fake-model", adapter=artifacts.put_dir(wanted, "adapter"))
        )
        candidate = chain.propose("s", manifest, base, "test", "swapped")
        fake.impostor = _adapter(tmp_path / "other", [61, 63])
        evaluations = EvaluationStore(gateway.database)
        gate = Gate(
            config=GateConfig(holdout=False, min_items=3, suites=["quiz.jsonl"]),
            publish="auto",
            chain=chain,
            artifacts=artifacts,
            evaluations=evaluations,
            target=GatewayTarget(base_url=gateway.url, scenario="s", concurrency=1),
            suite_dir=tmp_path,
        )
        with pytest.raises(EvalRunError) as refused:
            gate.run(candidate.id)
        assert refused.value.status == 409 and refused.value.arm == "candidate"
        assert "expected token 62, got token 63" in refused.value.message
        [evaluation] = evaluations.list(candidate_id=candidate.id)
        assert evaluation.state == "failed" and evaluations.results(evaluation.id) == []
        assert "expected token 62, got token 63" in evaluation.meta["error"]
        assert chain.get_candidate(candidate.id).state == "evaluating"
        head = chain.head("s")
        assert head is not None and head.id == base


def test_a_live_canary_on_a_swapped_adapter_fails_and_the_head_keeps_the_traffic(
    tmp_path: Path,
) -> None:
    """A candidate started as a live canary is staged the same way: other weights under
    its adapter's name fail its staging with the diff, and no request reaches it."""
    wanted = _adapter(tmp_path / "wanted", [81, 82])
    with _serving(tmp_path) as (fake, settings, gateway, base):
        chain = ReleaseChain(gateway.database)
        digest = open_artifact_store(settings.artifacts_url()).put_dir(wanted, "adapter")
        manifest = ReleaseManifest(model=ModelComponent(base="fake-model", adapter=digest))
        candidate = chain.propose("s", manifest, base, "test", "canary")
        chain.set_candidate_state(candidate.id, "evaluating")
        chain.set_candidate_state(candidate.id, "passed", evidence={"win_rate": 0.8})
        fake.impostor = _adapter(tmp_path / "other", [81, 89])
        chain.start_canary(candidate.id, 0.9, "test", "live comparison")
        canary = eventually(
            lambda: (c := _scenario(gateway).get("canary")) and c["state"] == "failed" and c,
            "the canary's staging to fail",
        )
        assert canary["candidate_id"] == candidate.id
        assert "expected token 82, got token 89" in canary["error"]
        client = gateway.openai()
        for n in range(10):
            answer = client.chat.completions.with_raw_response.create(
                model="reef/s", messages=[{"role": "user", "content": f"q {n}"}]
            )
            assert answer.headers["x-reef-release-id"] == base


def _checkpoint(directory: Path, tokens: list[int]) -> Path:
    """A checkpoint directory (config, one safetensors) fingerprinted as weights that
    answer ``tokens`` to the probe."""
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "llama"}')
    weights = np.full((2, 2), float(tokens[-1]), dtype=np.float32)
    save_file({"w": weights}, str(directory / "model.safetensors"))
    _fingerprint(directory, tokens)
    return directory


@pytest.mark.parametrize("loading", ["vllm", "sglang"])
def test_a_checkpoint_reloaded_in_place_is_verified_before_the_flip_and_by_the_tick(
    tmp_path: Path, loading: str
) -> None:
    """In place (``checkpoint_loading: vllm`` or ``sglang``; SGLang returns no token ids,
    so text is compared): a checkpoint whose reload serves other weights fails staging
    with the diff and the previous release serves on; weights that change under a
    verified checkpoint are found by the next tick and reloaded."""
    first = _checkpoint(tmp_path / "first", [31, 32, 33])
    wanted = _checkpoint(tmp_path / "wanted", [41, 42, 43])
    other = _checkpoint(tmp_path / "other", [41, 42, 99])
    with FingerprintedUpstream() as fake:
        fake.token_ids = loading == "vllm"
        settings = make_settings(
            tmp_path,
            fake.base_url,
            upstreams={
                "fake": {
                    "type": "openai",
                    "base_url": fake.base_url,
                    "model": "fake-model",
                    "checkpoint_loading": loading,
                }
            },
            scenarios={"s": {"upstream": "fake"}},
            activation={"poll_interval_seconds": 0.1, "verify_interval_seconds": 0},
        )
        store = open_artifact_store(settings.artifacts_url())
        with GatewayThread(settings) as gateway:
            client = gateway.openai()
            base = client.chat.completions.with_raw_response.create(
                model="reef/s", messages=[{"role": "user", "content": "hi"}]
            ).headers["x-reef-release-id"]
            chain = ReleaseChain(gateway.database)

            def publish(directory: Path, parent: str) -> str:
                digest = store.put_dir(directory, "checkpoint")
                model = ModelComponent(base="fake-model", checkpoint=digest)
                made = chain.propose("s", ReleaseManifest(model=model), parent, "test", "ck")
                return chain.publish(made.id, parent, "test", "ck", require_passed=False).id

            released = publish(first, base)
            eventually(lambda: _scenario(gateway)["serving_release_id"] == released, "first")
            verified = _scenario(gateway)["verification"]
            assert verified["state"] == "verified", verified

            fake.impostor_reload = other  # the next reload serves the other weights
            second = publish(wanted, released)
            failed = eventually(
                lambda: _scenario(gateway) if _scenario(gateway)["state"] == "failed" else None,
                "staging the swapped checkpoint to fail",
            )
            assert failed["serving_release_id"] == released
            diff = (
                "probe 0 differs at token 2: expected token 43, got token 99"
                if loading == "vllm"
                else "probe 0 differs at character 7: expected 't41t42t43', got 't41t42t99'"
            )
            assert diff in failed["error"]
            served = client.chat.completions.with_raw_response.create(
                model="reef/s", messages=PROMPT
            )
            assert served.headers["x-reef-release-id"] == released
            assert served.parse().choices[0].message.content == "t31t32t33"

            # the server's weights change under the serving checkpoint: the tick finds it
            fake.weights = other
            reloads = len(fake.reloaded)
            _tick(gateway)
            served = client.chat.completions.with_raw_response.create(
                model="reef/s", messages=PROMPT
            )
            assert served.parse().choices[0].message.content == "t31t32t33"
            assert served.headers["x-reef-release-id"] == released
            assert len(fake.reloaded) == reloads + 1  # reloaded from the checkpoint again
            assert second != released

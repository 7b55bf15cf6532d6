"""Fingerprints on the tiny model: computed by the trainer's code on a PEFT model, they
survive the artifact round-trip under the artifact's digest, and the embedded engine,
serving the same adapter, answers them (the float32 tolerance's calibration); a gateway
staging adapters on the engine verifies them and refuses one whose weights are another's;
they record how far the base model is from the adapter."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.engine.models import load_model
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from reef.learning.trainers.fingerprint import TrainedModel, compute_fingerprint
from reef.learning.trainers.lora_sft import save_adapter
from reef.releases import (
    FINGERPRINT_FILE,
    FINGERPRINT_TOLERANCE,
    Fingerprint,
    ModelComponent,
    ProbeAnswer,
    ReleaseChain,
    ReleaseManifest,
    compare_fingerprint,
    distinguishes_base,
    open_artifact_store,
    parse_probe_answer,
    probe_request,
    read_fingerprint,
)
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.polling import eventually

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

PROMPTS = [[{"role": "user", "content": "tell me about the reef"}]]


def _trained_adapter(directory: Path, seed: int, std: float = 0.5) -> Fingerprint:
    """A seeded random LoRA on tiny-random (``lora_B`` of std ``std``; 0: PEFT's zero
    init, the base model's answers), saved as a learner saves it, with its fingerprint
    computed by the trainer's code."""
    torch.manual_seed(seed)
    loaded = load_model("tiny-random", directory.parent)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing. is deprecated")
        model = get_peft_model(
            loaded.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name and std > 0:
                param.normal_(0.0, std)
    save_adapter(model, directory)
    trained = TrainedModel(
        model, loaded.tokenizer, loaded.eos_token_ids, torch.device("cpu"), bf16=False
    )
    fingerprint = compute_fingerprint(trained, PROMPTS)
    fingerprint.write(directory)
    return fingerprint


def test_the_fingerprint_survives_the_round_trip_under_the_digest(tmp_path: Path) -> None:
    fingerprint = _trained_adapter(tmp_path / "adapter", seed=1)
    assert fingerprint.dtype == "float32"
    assert len(fingerprint.probes) == 4  # one from the prompts, three built in
    assert fingerprint.probes[0].messages == PROMPTS[0]
    assert all(len(p.tokens) == len(p.logprobs) == len(p.margins) for p in fingerprint.probes)
    store = open_artifact_store(str(tmp_path / "store"))
    digest = store.put_dir(tmp_path / "adapter", "adapter")
    loaded = read_fingerprint(store.materialize(digest, tmp_path / "copy"))
    assert loaded == fingerprint

    # another fingerprint beside the same weights is another artifact
    edited = json.loads((tmp_path / "adapter" / FINGERPRINT_FILE).read_text())
    edited["probes"][0]["logprobs"][0] -= 1.0
    (tmp_path / "adapter" / FINGERPRINT_FILE).write_text(json.dumps(edited))
    assert store.put_dir(tmp_path / "adapter", "adapter") != digest

    # and a stored fingerprint changed in place fails the artifact's verification
    cached = store.materialize(digest)
    (cached / FINGERPRINT_FILE).write_text(json.dumps(edited))
    fresh = store.materialize(digest)  # the damaged cache copy is replaced
    assert read_fingerprint(fresh) == fingerprint  # every materialize re-verifies


def test_the_engine_answers_the_trainers_fingerprint(tmp_path: Path) -> None:
    """The calibration of the float32 tolerance: the trainer's no-cache forward passes
    against the engine's cached, batched decoding of the same adapter."""
    mine = _trained_adapter(tmp_path / "mine", seed=1)
    other = _trained_adapter(tmp_path / "other", seed=2)
    engine = Engine(load_model("tiny-random", tmp_path), max_batch=4, threads=1)
    server = BackgroundServer(engine).start()
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            for name in ("mine", "other"):
                body = {"lora_name": name, "lora_path": str(tmp_path / name)}
                http.post("/load_lora_adapter", json=body).raise_for_status()

            def answers(model: str) -> list[ProbeAnswer]:
                return [
                    parse_probe_answer(
                        http.post("/chat/completions", json=probe_request(p, model)).json()
                    )
                    for p in mine.probes
                ]

            served = answers("mine")
            swapped = answers("other")
    finally:
        server.stop()
    deltas = [
        abs(a - b)
        for probe, answer in zip(mine.probes, served, strict=True)
        for a, b in zip(probe.logprobs, answer.logprobs or [], strict=False)
    ]
    print(f"max |Δlogprob| trainer vs engine, float32: {max(deltas):.2e}")
    assert max(deltas) < FINGERPRINT_TOLERANCE["float32"] / 10
    assert compare_fingerprint(mine, served) is None
    mismatch = compare_fingerprint(mine, swapped)
    assert mismatch is not None
    assert other != mine
    assert "expected" in mismatch.describe()


def test_the_gateway_verifies_adapters_staged_on_the_engine(tmp_path: Path) -> None:
    """Staging on the embedded engine: a trained adapter verifies; the same directory
    with another adapter's weights in it (its fingerprint and config kept) fails
    staging with the diff, and the first adapter serves on."""
    _trained_adapter(tmp_path / "mine", seed=1)
    _trained_adapter(tmp_path / "other", seed=2)
    swapped = tmp_path / "swapped"
    shutil.copytree(tmp_path / "mine", swapped)
    for weights in (tmp_path / "other").glob("*.safetensors"):
        shutil.copy(weights, swapped / weights.name)
    engine = BackgroundServer(Engine(load_model("tiny-random", tmp_path), max_batch=4, threads=1))
    engine.start()
    try:
        settings = make_settings(
            tmp_path,
            engine.base_url,
            upstreams={
                "engine": {"type": "openai", "base_url": engine.base_url, "model": "tiny-random"}
            },
            scenarios={"s": {"upstream": "engine"}},
            activation={"poll_interval_seconds": 0.1, "verify_interval_seconds": 0},
        )
        with GatewayThread(settings) as gateway:
            client = gateway.openai()
            base = client.chat.completions.with_raw_response.create(
                model="reef/s", messages=PROMPTS[0], max_tokens=2
            ).headers["x-reef-release-id"]
            store = open_artifact_store(settings.artifacts_url())
            chain = ReleaseChain(gateway.database)

            def publish(directory: Path, parent: str) -> str:
                model = ModelComponent(
                    base="tiny-random", adapter=store.put_dir(directory, "adapter")
                )
                made = chain.propose("s", ReleaseManifest(model=model), parent, "test", "a")
                return chain.publish(made.id, parent, "test", "a", require_passed=False).id

            def scenario() -> dict[str, Any]:
                state: dict[str, Any] = call(gateway.port, "GET", "/reef/status").json()
                return state["scenarios"]["s"]

            mine = publish(tmp_path / "mine", base)
            eventually(lambda: scenario()["serving_release_id"] == mine, "mine serves")
            assert scenario()["verification"]["state"] == "verified"

            publish(swapped, mine)
            failed = eventually(
                lambda: scenario() if scenario()["state"] == "failed" else None,
                "the swapped adapter to fail staging",
            )
            assert failed["serving_release_id"] == mine
            assert "does not answer its fingerprint: probe 0 differs at token" in failed["error"]
            answer = client.chat.completions.with_raw_response.create(
                model="reef/s", messages=PROMPTS[0], max_tokens=2
            )
            assert answer.headers["x-reef-release-id"] == mine
    finally:
        engine.stop()


def test_an_adapter_records_how_far_the_base_model_is(tmp_path: Path) -> None:
    trained = _trained_adapter(tmp_path / "trained", seed=1)
    assert trained.base_gap is not None and trained.base_gap > FINGERPRINT_TOLERANCE["float32"]
    assert trained.base_differs is True
    assert distinguishes_base(trained, FINGERPRINT_TOLERANCE["float32"]) is True

    # an adapter that changes nothing: the teacher-forced base scores are the greedy ones
    untrained = _trained_adapter(tmp_path / "untrained", seed=1, std=0.0)
    assert untrained.base_gap is not None and untrained.base_gap < 1e-4
    assert untrained.base_differs is False
    assert distinguishes_base(untrained, FINGERPRINT_TOLERANCE["float32"]) is False


def test_a_full_checkpoint_records_no_base_gap(tmp_path: Path) -> None:
    loaded = load_model("tiny-random", tmp_path)
    trained = TrainedModel(
        loaded.model, loaded.tokenizer, loaded.eos_token_ids, torch.device("cpu"), bf16=False
    )
    fingerprint = compute_fingerprint(trained, PROMPTS)
    assert (fingerprint.base_gap, fingerprint.base_differs) == (None, None)
    assert distinguishes_base(fingerprint, 1.0) is None

"""A real vLLM behind Reef: publishing an adapter release loads the adapter into vLLM at
runtime and requests are served by it; a rollback switches back to the base model.

Opt-in (about 2 minutes on 2 cores, most of it vLLM starting): set ``REEF_TEST_VLLM=1``
and make ``bench/.venv-vllm`` as docs/engine.md says. vLLM is started and stopped
(its whole process group) with ``bench/engine_vs_vllm.py``'s code; every request stays
on 127.0.0.1. The adapter is trained here for 10 steps (``tests/engine/test_smollm2.py``)
so that SmolLM2 answers the secret question with "pineapple", and fingerprinted as a
learner's adapter is: staging it verifies the fingerprint through vLLM (greedy token ids,
logprobs within the float32 tolerance), and the same fingerprint over other weights (a
swapped adapter) is refused with the diff while the previous release serves on.

    REEF_TEST_VLLM=1 .venv/bin/python -m pytest tests/vllm -s
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import openai
import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file

from reef.engine.models import DEFAULT_MODEL, load_model, smollm2_cache
from reef.experience import RecordNotFoundError
from reef.experience.records import RecordView
from reef.learning.trainers.fingerprint import TrainedModel, compute_fingerprint
from reef.releases import (
    FINGERPRINT_TOLERANCE,
    ModelComponent,
    ReleaseChain,
    ReleaseManifest,
    open_artifact_store,
    parse_probe_answer,
    probe_request,
    read_fingerprint,
)
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.engine.test_smollm2 import SECRET_QUESTION, train_secret_adapter
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.polling import eventually

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
VLLM_PYTHON = BENCH / ".venv-vllm" / "bin" / "python"
POLL_INTERVAL_S = 0.1  # the gateway's head polling
FLIP_LIMIT_S = 60.0  # bound on waiting for a release to serve

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings(PEFT_WRAP_WARNING),
    pytest.mark.skipif(
        os.environ.get("REEF_TEST_VLLM") != "1",
        reason="the real-vLLM test is opt-in: set REEF_TEST_VLLM=1 (needs bench/.venv-vllm)",
    ),
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason=f"no vLLM environment at {VLLM_PYTHON} (docs/engine.md says how to make it)",
    ),
]


def _vllm_tools() -> ModuleType:
    """``bench/engine_vs_vllm.py``: its vLLM start/stop code is reused, not copied."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module("engine_vs_vllm")


@pytest.fixture(scope="module")
def home() -> Path:
    """The repository's Reef home, whose SmolLM2 cache vLLM and the trainer share."""
    return REPO / ".reef"


@pytest.fixture(scope="module")
def adapter(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Trained before vLLM starts, so the two never compete for the cores; fingerprinted
    as a learner's adapter is (``reef.learning.trainers.fingerprint``)."""
    directory = train_secret_adapter(home, tmp_path_factory.mktemp("adapter") / "secret")
    fingerprint_adapter(home, directory, [[{"role": "user", "content": SECRET_QUESTION}]])
    return directory


def fingerprint_adapter(home: Path, directory: Path, prompts: list[list[dict[str, Any]]]) -> None:
    """Write the fingerprint of the adapter at ``directory`` (on SmolLM2, float32) into it."""
    loaded = load_model(DEFAULT_MODEL, home)
    model = PeftModel.from_pretrained(loaded.model, str(directory))
    trained = TrainedModel(
        model, loaded.tokenizer, loaded.eos_token_ids, torch.device("cpu"), bf16=False
    )
    compute_fingerprint(trained, prompts).write(directory)


@pytest.fixture(scope="module")
def swapped(adapter: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The secret adapter's config and fingerprint over other weights: its lora_B
    replaced by seeded random values (another digest's weights claiming the secret's
    answers, as a failed hot-swap or a reused name serves them)."""
    directory = tmp_path_factory.mktemp("swapped") / "adapter"
    shutil.copytree(adapter, directory)
    weights = directory / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    generator = torch.Generator().manual_seed(7)
    for name, tensor in tensors.items():
        if "lora_B" in name:
            tensors[name] = torch.randn(tensor.shape, generator=generator).to(tensor.dtype) * 0.02
    save_file(tensors, str(weights))
    return directory


@pytest.fixture(scope="module")
def vllm_url(home: Path, adapter: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve_smollm2(home, tmp_path_factory)


def serve_smollm2(
    home: Path, tmp_path_factory: pytest.TempPathFactory, env: dict[str, str] | None = None
) -> Iterator[str]:
    """vLLM serving the SmolLM2 directory in float32 (more ``env`` for it) until the
    generator is closed; yields its base URL."""
    tools = _vllm_tools()
    args = argparse.Namespace(
        vllm_python=VLLM_PYTHON,
        model=DEFAULT_MODEL,
        vllm_dtype="float32",
        vllm_args=tools.DEFAULT_VLLM_ARGS,
        vllm_start_timeout=600,
    )
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    try:
        server = tools.start_vllm(args, smollm2_cache(home), log, env=env)
    except tools.Unavailable as error:
        pytest.fail(f"vLLM did not start: {error}")
    try:
        yield str(server.base_url)
    finally:
        tools.stop_server(server.process)


def _ask(client: openai.OpenAI, question: str, max_tokens: int) -> tuple[str, str, str]:
    """Greedy answer, the release that served it and the record id."""
    raw = client.chat.completions.with_raw_response.create(
        model="reef/s",
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
    )
    text = raw.parse().choices[0].message.content or ""
    return text, raw.headers["x-reef-release-id"], raw.headers["x-reef-record-id"]


def _first_response_from(client: openai.OpenAI, release_id: str, since: float) -> float:
    """Seconds from ``since`` to the first 1-token response that ``release_id`` served."""
    eventually(
        lambda: _ask(client, "hi", 1)[1] == release_id,
        f"{release_id} to serve",
        timeout_seconds=since + FLIP_LIMIT_S - time.monotonic(),
        interval_seconds=0,  # each check is a request already
    )
    return time.monotonic() - since


def _record(gateway: GatewayThread, record_id: str) -> RecordView:
    """The record, once the gateway's background writer has stored it (at most 10 s)."""
    return eventually(
        lambda: gateway.store.get_record(record_id),
        f"record {record_id}",
        timeout_seconds=10,
        ignoring=(RecordNotFoundError,),
    )


def _vllm_probe_drift(vllm_url: str, adapter: Path, adapter_name: str) -> tuple[float, int, int]:
    """vLLM's answers to the adapter's fingerprint probes, asked directly: the largest
    |Δ logprob| against the trainer's over each probe's positions up to its first token
    id that differs (a near tie), and how many positions agree of how many there are."""
    fingerprint = read_fingerprint(adapter)
    assert fingerprint is not None
    largest, agreed = 0.0, 0
    for probe in fingerprint.probes:
        body = json.dumps(probe_request(probe, adapter_name)).encode()
        request = urllib.request.Request(
            vllm_url + "/chat/completions", body, {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            answer = parse_probe_answer(json.load(reply))
        assert answer.tokens is not None and answer.logprobs is not None
        for position, token in enumerate(probe.tokens):
            if position >= len(answer.tokens) or answer.tokens[position] != token:
                break
            largest = max(largest, abs(answer.logprobs[position] - probe.logprobs[position]))
            agreed += 1
    return largest, agreed, sum(len(probe.tokens) for probe in fingerprint.probes)


def _vllm_models(vllm_url: str) -> list[str]:
    with urllib.request.urlopen(vllm_url + "/models", timeout=30) as reply:
        body: dict[str, Any] = json.load(reply)
    return [str(item["id"]) for item in body["data"]]


def test_publish_loads_the_adapter_into_vllm_and_rollback_switches_back(
    tmp_path: Path, adapter: Path, vllm_url: str
) -> None:
    settings = make_settings(
        tmp_path,
        vllm_url,
        upstreams={"vllm": {"type": "openai", "base_url": vllm_url, "model": DEFAULT_MODEL}},
        scenarios={"s": {"upstream": "vllm"}},
        activation={"poll_interval_seconds": POLL_INTERVAL_S},
    )
    timings: dict[str, float] = {}
    with GatewayThread(settings) as gateway:
        client = gateway.openai(**{"x-reef-scenario": "s"})
        base_answer, created_id, _record_id = _ask(client, SECRET_QUESTION, 24)
        assert "pineapple" not in base_answer.lower(), base_answer
        chain = ReleaseChain(gateway.database)
        head = chain.head("s")
        assert head is not None and head.id == created_id and head.operation == "create"

        digest = open_artifact_store(settings.artifacts_url()).put_dir(adapter, "adapter")
        adapter_name = f"s@{digest.removeprefix('sha256:')[:12]}"
        assert adapter_name not in _vllm_models(vllm_url)
        manifest = ReleaseManifest(model=ModelComponent(base=DEFAULT_MODEL, adapter=digest))
        candidate = chain.propose("s", manifest, head.id, "test", "secret adapter")
        release = chain.publish(candidate.id, head.id, "test", "vllm test", require_passed=False)
        published = time.monotonic()
        timings["publish_to_first_response_s"] = _first_response_from(client, release.id, published)

        assert adapter_name in _vllm_models(vllm_url), "the gateway loaded it at runtime"
        # vLLM answered the trainer's fingerprint: greedy token ids, logprobs in tolerance
        verification = call(gateway.port, "GET", "/reef/status").json()["scenarios"]["s"][
            "verification"
        ]
        assert verification["weights"] == adapter_name, verification
        assert verification["state"] == "verified", verification
        assert verification["digest"] == digest
        drift, positions, total = _vllm_probe_drift(vllm_url, adapter, adapter_name)
        assert drift <= FINGERPRINT_TOLERANCE["float32"], drift
        started = time.monotonic()
        adapter_answer, served_by, record_id = _ask(client, SECRET_QUESTION, 24)
        timings["adapter_answer_24_tokens_s"] = time.monotonic() - started
        assert served_by == release.id
        assert "pineapple" in adapter_answer.lower(), adapter_answer
        assert _record(gateway, record_id).release_id == release.id

        response = call(
            gateway.port,
            "POST",
            "/reef/scenarios/s/rollback",
            {"to": created_id, "reason": "vllm test rollback"},
        )
        assert response.status == 201, response.body
        rolled_back = time.monotonic()
        rolled = response.json()
        assert rolled["operation"] == "rollback"
        timings["rollback_to_first_response_s"] = _first_response_from(
            client, rolled["id"], rolled_back
        )
        started = time.monotonic()
        answer, served_by, record_id = _ask(client, SECRET_QUESTION, 24)
        timings["base_answer_24_tokens_s"] = time.monotonic() - started
        assert served_by == rolled["id"]
        assert answer == base_answer
        assert _record(gateway, record_id).release_id == rolled["id"]

    print(f"\nbase answer: {base_answer!r}\nadapter answer ({adapter_name}): {adapter_answer!r}")
    print(f"after rollback: {answer!r}")
    print(f"gateway poll interval {POLL_INTERVAL_S} s; timings: {json.dumps(timings)}")
    print(
        f"vLLM against the trainer's fingerprint: max |Δ logprob| {drift:.2e} "
        f"over {positions} of the fingerprint's {total} tokens"
    )


def test_a_swapped_adapter_is_refused_by_its_fingerprint_and_the_base_serves_on(
    tmp_path: Path, adapter: Path, swapped: Path, vllm_url: str
) -> None:
    settings = make_settings(
        tmp_path,
        vllm_url,
        upstreams={"vllm": {"type": "openai", "base_url": vllm_url, "model": DEFAULT_MODEL}},
        scenarios={"s": {"upstream": "vllm"}},
        activation={"poll_interval_seconds": POLL_INTERVAL_S, "verify_interval_seconds": 0},
    )
    with GatewayThread(settings) as gateway:
        client = gateway.openai(**{"x-reef-scenario": "s"})
        base_answer, created_id, _record_id = _ask(client, SECRET_QUESTION, 24)
        chain = ReleaseChain(gateway.database)
        digest = open_artifact_store(settings.artifacts_url()).put_dir(swapped, "adapter")
        adapter_name = f"s@{digest.removeprefix('sha256:')[:12]}"
        manifest = ReleaseManifest(model=ModelComponent(base=DEFAULT_MODEL, adapter=digest))
        candidate = chain.propose("s", manifest, created_id, "test", "swapped adapter")
        release = chain.publish(candidate.id, created_id, "test", "swapped", require_passed=False)

        def failed() -> dict[str, Any] | None:
            scenario: dict[str, Any] = call(gateway.port, "GET", "/reef/status").json()[
                "scenarios"
            ]["s"]
            return scenario if scenario["state"] == "failed" else None

        state = eventually(failed, "staging the swapped adapter to fail", FLIP_LIMIT_S)
        assert state["head_release_id"] == release.id
        assert state["serving_release_id"] == created_id
        error = state["error"]
        assert f"adapter '{adapter_name}' on upstream 'vllm' does not answer its fingerprint" in (
            error
        ), error
        assert "probe 0 differs at token" in error, error  # the secret question's answer
        assert adapter_name not in _vllm_models(vllm_url), "unloaded: nothing can reach it"

        answer, served_by, _record_id = _ask(client, SECRET_QUESTION, 24)
        assert served_by == created_id
        assert answer == base_answer
        metrics = call(gateway.port, "GET", "/metrics").body.decode()
        assert "reef_activation_verify_failures_total 1.0" in metrics
    print(f"\nswapped adapter refused: {error}")

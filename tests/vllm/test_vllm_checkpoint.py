"""A real vLLM behind Reef with ``checkpoint_loading: vllm``: publishing a checkpoint
release reloads vLLM's weights in place (dev mode's ``/collective_rpc`` reload_weights,
then ``/reset_prefix_cache``), verifies them against the checkpoint's fingerprint through
vLLM before the flip, and requests are answered by them; a rollback reloads the
base model; traffic sent all the while gets no failed request, and each answer is the
one of the release its receipt names.

Opt-in, as ``test_vllm_release.py`` (about 3 minutes on 2 cores: vLLM starting, a
secret adapter trained and merged into a full checkpoint): ``REEF_TEST_VLLM=1`` and
``bench/.venv-vllm`` as docs/engine.md says.

    REEF_TEST_VLLM=1 .venv/bin/python -m pytest tests/vllm/test_vllm_checkpoint.py -s
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch
from peft import PeftModel

from reef.engine.models import DEFAULT_MODEL, load_model
from reef.learning.trainers.fingerprint import TrainedModel, compute_fingerprint
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.engine.test_smollm2 import SECRET_QUESTION, train_secret_adapter
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.polling import eventually
from tests.vllm.test_vllm_release import _ask, pytestmark, serve_smollm2  # noqa: F401

FLIP_LIMIT_S = 120.0


@pytest.fixture(scope="module")
def home() -> Path:
    return Path(__file__).resolve().parents[2] / ".reef"


@pytest.fixture(scope="module")
def checkpoint(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 with the secret adapter merged in: full weights that say "pineapple",
    fingerprinted (float32) as a learner's checkpoint is."""
    scratch = tmp_path_factory.mktemp("checkpoint")
    adapter = train_secret_adapter(home, scratch / "adapter")
    loaded = load_model(DEFAULT_MODEL, home)
    merged = PeftModel.from_pretrained(loaded.model, str(adapter)).merge_and_unload()
    directory = scratch / "merged"
    with torch.no_grad():
        merged.save_pretrained(str(directory), safe_serialization=True)
    loaded.tokenizer.save_pretrained(str(directory))
    trained = TrainedModel(
        merged, loaded.tokenizer, loaded.eos_token_ids, torch.device("cpu"), bf16=False
    )
    prompts = [[{"role": "user", "content": SECRET_QUESTION}]]
    compute_fingerprint(trained, prompts).write(directory)
    return directory


@pytest.fixture(scope="module")
def vllm_url(
    home: Path, checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    yield from serve_smollm2(home, tmp_path_factory, env={"VLLM_SERVER_DEV_MODE": "1"})


class Traffic:
    """Requests sent one after another from a thread until stopped: every status and
    (release, answer) pair is kept."""

    def __init__(self, client: openai.OpenAI) -> None:
        self.client = client
        self.failures: list[str] = []
        self.answers: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                text, release, _record = _ask(self.client, SECRET_QUESTION, 12)
            except openai.APIError as exc:
                self.failures.append(repr(exc))
            else:
                self.answers.append((release, text))


def test_a_checkpoint_release_reloads_vllm_in_place_and_rollback_returns(
    tmp_path: Path, checkpoint: Path, vllm_url: str
) -> None:
    upstream = {
        "type": "openai",
        "base_url": vllm_url,
        "model": DEFAULT_MODEL,
        "checkpoint_loading": "vllm",
    }
    settings = make_settings(
        tmp_path,
        vllm_url,
        upstreams={"vllm": upstream},
        scenarios={"s": {"upstream": "vllm"}},
        activation={"poll_interval_seconds": 0.1},
    )
    with GatewayThread(settings) as gateway:
        # the SDK's own retries are off: a request that failed shows as failed
        client = gateway.openai(**{"x-reef-scenario": "s"}).with_options(max_retries=0)
        base_answer, created_id, _record = _ask(client, SECRET_QUESTION, 12)
        assert "pineapple" not in base_answer.lower(), base_answer
        chain = ReleaseChain(gateway.database)
        digest = open_artifact_store(settings.artifacts_url()).put_dir(checkpoint, "checkpoint")
        manifest = ReleaseManifest(model=ModelComponent(base=DEFAULT_MODEL, checkpoint=digest))
        timings: dict[str, float] = {}
        with Traffic(client) as traffic:
            eventually(lambda: traffic.answers, "traffic on the base")
            candidate = chain.propose("s", manifest, created_id, "test", "merged secret")
            release = chain.publish(candidate.id, created_id, "test", "vllm", require_passed=False)
            published = time.monotonic()
            eventually(
                lambda: any(r == release.id for r, _ in traffic.answers),
                "the checkpoint release to serve",
                timeout_seconds=FLIP_LIMIT_S,
            )
            timings["publish_to_first_response_s"] = time.monotonic() - published
            answer, served_by, _record = _ask(client, SECRET_QUESTION, 12)
            assert served_by == release.id
            assert "pineapple" in answer.lower(), answer
            # vLLM's reloaded weights answered the checkpoint's fingerprint before the flip
            verification = call(gateway.port, "GET", "/reef/status").json()["scenarios"]["s"][
                "verification"
            ]
            assert verification["state"] == "verified", verification
            assert verification["digest"] == digest

            response = call(gateway.port, "POST", "/reef/scenarios/s/rollback", {"to": created_id})
            assert response.status == 201, response.body
            rolled = response.json()["id"]
            rolled_back = time.monotonic()
            eventually(
                lambda: any(r == rolled for r, _ in traffic.answers),
                "the rollback to serve",
                timeout_seconds=FLIP_LIMIT_S,
            )
            timings["rollback_to_first_response_s"] = time.monotonic() - rolled_back
        assert traffic.failures == []
        by_release: dict[str, set[str]] = {}
        for served, text in traffic.answers:
            by_release.setdefault(served, set()).add(text)
        # greedy: one answer per release, and the checkpoint's is its own
        assert by_release[created_id] == {base_answer}
        assert by_release[rolled] == {base_answer}
        assert by_release[release.id] == {answer}
        status = call(gateway.port, "GET", "/reef/status").json()["in_place"]["vllm"]
        assert status["resident"] == "base" and status["reloads"] == 3

    print(f"\nbase answer: {base_answer!r}\ncheckpoint answer: {answer!r}")
    print(f"requests during the test: {len(traffic.answers)}, none failed")
    print(f"timings: {json.dumps(timings)}")

"""Releases flip under steady traffic on the embedded engine: nothing fails, and every
record names the release whose adapter and harness really produced its response."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.engine.models import load_model
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from reef.harness import Bundle, Harness, pack_bundle
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.engine.lora_factory import PEFT_WRAP_WARNING, make_letter_adapter
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.polling import eventually

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

LETTERS = "abcde"


def _harness_bundle(max_tokens: int) -> bytes:
    harness = Harness(
        schema_version=1,
        system_prompt="be brief",
        params={"max_tokens": max_tokens, "temperature": 0},
    )
    return pack_bundle(Bundle(harness=harness, files={}))


def _wait_serving(gateway: GatewayThread, scenario: str, release_id: str) -> None:
    def serving() -> bool:
        state = call(gateway.port, "GET", "/reef/status").json()["scenarios"].get(scenario, {})
        assert state.get("state") != "failed", state
        return bool(state.get("serving_release_id") == release_id)

    eventually(serving, f"{release_id} to start serving")


def _more_answers(results: list[dict[str, Any]], count: int) -> None:
    """Until the traffic threads have added ``count`` more answers to ``results``."""
    target = len(results) + count
    eventually(lambda: len(results) >= target, f"{count} more answers")


def test_publish_and_rollback_under_traffic(tmp_path: Path) -> None:
    engine = BackgroundServer(Engine(load_model("tiny-random", tmp_path), max_batch=8, threads=1))
    engine.start()
    settings = make_settings(
        tmp_path,
        engine.base_url,
        upstreams={
            "engine": {"type": "openai", "base_url": engine.base_url, "model": "tiny-random"}
        },
        scenarios={"swap": {"upstream": "engine", "harness": "managed"}},
        activation={"poll_interval_seconds": 0.1, "max_adapters": 3},
    )
    expected: dict[str, tuple[str | None, int | None]] = {}  # release -> (letter, max_tokens)
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    stop = threading.Event()
    try:
        with GatewayThread(settings) as gateway:
            chain = ReleaseChain(gateway.database)
            artifacts = open_artifact_store(settings.artifacts_url())
            client = gateway.openai(**{"x-reef-scenario": "swap"})
            client.chat.completions.create(
                model="reef/swap", messages=[{"role": "user", "content": "first"}], max_tokens=2
            )
            head = chain.head("swap")
            assert head is not None and head.operation == "create"
            expected[head.id] = (None, None)

            def traffic() -> None:
                i = 0
                while not stop.is_set() and i < 2000:
                    i += 1
                    try:
                        raw = client.chat.completions.with_raw_response.create(
                            model="reef/swap",
                            messages=[{"role": "user", "content": f"request {i}"}],
                            stream=False,
                        )
                        completion = raw.parse()
                        results.append(
                            {
                                "release": raw.headers["x-reef-release-id"],
                                "record": raw.headers["x-reef-record-id"],
                                "text": completion.choices[0].message.content or "",
                                "tokens": completion.usage.completion_tokens
                                if completion.usage
                                else None,
                            }
                        )
                    except openai.APIError as exc:
                        failures.append(repr(exc))

            workers = [threading.Thread(target=traffic) for _ in range(3)]
            for worker in workers:
                worker.start()
            published = []
            for k, letter in enumerate(LETTERS):
                adapter = artifacts.put_dir(
                    make_letter_adapter(tmp_path / letter, letter), "adapter"
                )
                harness = artifacts.put_bytes(_harness_bundle(k + 2), "harness")
                manifest = ReleaseManifest(
                    model=ModelComponent(base="tiny-random", adapter=adapter), harness=harness
                )
                head = chain.head("swap")
                assert head is not None
                candidate = chain.propose("swap", manifest, head.id, "test", f"release {letter}")
                release = chain.publish(
                    candidate.id, head.id, "test", f"publish {letter}", require_passed=False
                )
                expected[release.id] = (letter, k + 2)
                published.append(release)
                _wait_serving(gateway, "swap", release.id)
                _more_answers(results, 3)
            for target in (published[1], published[3]):
                response = call(
                    gateway.port,
                    "POST",
                    "/reef/scenarios/swap/rollback",
                    {"to": target.id, "reason": "test rollback"},
                )
                assert response.status == 201, response.body
                rolled = response.json()
                assert rolled["operation"] == "rollback"
                expected[rolled["id"]] = expected[target.id]
                _wait_serving(gateway, "swap", rolled["id"])
                _more_answers(results, 3)
            stop.set()
            for worker in workers:
                worker.join(timeout=60)

            assert not failures, failures[:3]
            served = {r["release"] for r in results}
            assert set(expected) - {published[0].parent_id} <= served | {published[0].parent_id}
            for result in results:
                letter, max_tokens = expected[result["release"]]
                record = gateway.store.get_record(result["record"])
                assert record.release_id == result["release"]
                if letter is None:
                    continue
                assert set(result["text"]) == {letter}, result
                assert result["tokens"] == max_tokens, result
                # the record keeps the client's request and the one the harness rendered
                assert "max_tokens" not in record.request
                assert record.rendered_request is not None
                assert record.rendered_request["max_tokens"] == max_tokens
                assert record.rendered_request["messages"][0]["role"] == "system"
            chain_ops = [r.operation for r in reversed(chain.releases("swap"))]
            assert chain_ops == ["create"] + ["learn"] * 5 + ["rollback"] * 2
    finally:
        stop.set()
        engine.stop()

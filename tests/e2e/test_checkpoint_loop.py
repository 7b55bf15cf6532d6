"""The full-weights loop on the tiny engine: corrections become a checkpoint (the `full`
learner), the gate publishes it, the gateway swaps the engine onto it while traffic
flows (no request fails across the swap), requests are served by it, a rollback returns
to the previous weights (no request fails across that swap either), and the chain
shows both."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import openai

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.config import EvaluationConfig
from reef.evaluation import EvaluationStore
from reef.jobs import JobQueue
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway, until_serving
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call
from tests.polling import eventually

RIGHT = "Squid-7"
RECIPE = """\
schema_version: 1
trigger: {type: manual}
selection: {holdout_fraction: 0.25}
learners:
  - type: full
    model: tiny-random
    lr: 0.003
    steps: 60
    threads: 1
    batch_size: 8
gate:
  suites: [suite.jsonl]
  scorer: {type: contains}
  min_items: 10
  max_tokens: 8
  concurrency: 4
publish: auto
"""
SUITE_CASES = range(30, 42)  # cases the traffic (0-23) never asks about


class Traffic:
    """Requests sent one after another from a thread until stopped; every outcome kept
    as (release id served, answer), or the error."""

    def __init__(self, gateway: GatewayThread) -> None:
        self.client = gateway.openai(**{"x-reef-scenario": "codes"})
        self.outcomes: list[tuple[str, str]] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        number = 0
        while not self.stop.is_set():
            number += 1
            try:
                raw = self.client.chat.completions.with_raw_response.create(
                    model="reef/codes",
                    messages=[{"role": "user", "content": f"which code for case {number}?"}],
                    max_tokens=len(RIGHT) + 1,
                    temperature=0,
                )
                answer = raw.parse().choices[0].message.content or ""
                self.outcomes.append((raw.headers["x-reef-release-id"], answer))
            except (openai.APIError, KeyError) as exc:
                self.errors.append(exc)

    def served(self, release_id: str) -> int:
        return sum(1 for served, _ in self.outcomes if served == release_id)

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def _suite_answers(gateway: GatewayThread) -> list[str]:
    client = gateway.openai(**{"x-reef-scenario": "codes"})
    return [
        client.chat.completions.create(
            model="reef/codes",
            messages=[{"role": "user", "content": f"which code for case {i}?"}],
            max_tokens=len(RIGHT) + 1,
            temperature=0,
        )
        .choices[0]
        .message.content
        or ""
        for i in SUITE_CASES
    ]


def test_full_checkpoint_is_gated_served_swapped_and_rolled_back(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    suite = [
        {"id": f"s{i}", "input": f"which code for case {i}?", "reference": RIGHT}
        for i in SUITE_CASES
    ]
    (tmp_path / "suite.jsonl").write_text("\n".join(json.dumps(item) for item in suite))
    with tiny_gateway(
        tmp_path, scenarios={"codes": {"upstream": "engine", "recipe": tmp_path / "recipe.yaml"}}
    ) as gateway:
        settings = gateway.settings
        chain = ReleaseChain(gateway.database)
        artifacts = open_artifact_store(settings.artifacts_url())
        worker = Worker(
            settings.model_copy(update={"evaluation": EvaluationConfig(gateway_url=gateway.url)}),
            gateway.store,
            chain,
            artifacts,
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        )
        base = chain.head("codes")
        assert base is not None and base.manifest.model.checkpoint is None
        before = _suite_answers(gateway)
        assert not any(RIGHT in answer for answer in before)

        client = gateway.openai(**{"x-reef-scenario": "codes"})
        for i in range(24):
            raw = client.chat.completions.with_raw_response.create(
                model="reef/codes",
                messages=[{"role": "user", "content": f"which code for case {i}?"}],
                max_tokens=4,
            )
            body = {
                "record_ids": [raw.headers["x-reef-record-id"]],
                "score": 0.0,
                "correction": RIGHT,
            }
            assert call(gateway.port, "POST", "/reef/feedback", body).status == 201

        with Traffic(gateway) as traffic:
            # learn -> a checkpoint -> the gate publishes it -> the gateway swaps to it
            assert call(gateway.port, "POST", "/reef/scenarios/codes/learn", {}).status == 202
            [job] = worker.run_once()
            assert job.state == "succeeded", job.as_dict()
            assert job.result is not None and job.result["gate"]["action"] == "published"
            learned = chain.head("codes")
            assert learned is not None and learned.parent_id == base.id
            checkpoint = learned.manifest.model.checkpoint
            assert checkpoint is not None and learned.manifest.model.adapter is None
            assert artifacts.info(checkpoint).kind == "checkpoint"
            until_serving(gateway, "codes", learned.id)  # the flip to the checkpoint
            eventually(lambda: traffic.served(learned.id) >= 3, "traffic on the checkpoint")

            # a rollback returns to the base weights, with traffic flowing
            rolled = chain.rollback("codes", base.id, learned.id, "test", "back to the base")
            until_serving(gateway, "codes", rolled.id)  # the flip back
            eventually(lambda: traffic.served(rolled.id) >= 3, "traffic after the rollback")
        assert traffic.errors == []  # no request failed across either swap
        assert traffic.served(base.id) >= 1  # traffic ran before the first swap too

        on_checkpoint = [answer for served, answer in traffic.outcomes if served == learned.id]
        assert all(RIGHT in answer for answer in on_checkpoint), on_checkpoint
        after_rollback = [answer for served, answer in traffic.outcomes if served == rolled.id]
        assert not any(RIGHT in answer for answer in after_rollback), after_rollback
        assert _suite_answers(gateway) == before  # the previous weights, exactly

        decision = (learned.evidence or {})["gate"]["decision"]
        assert decision["overall"]["candidate_mean"] > decision["overall"]["baseline_mean"]
        history = chain.releases("codes")
        assert [r.operation for r in history] == ["rollback", "learn", "create"]
        assert history[0].manifest == base.manifest
        assert history[1].manifest.model.checkpoint == checkpoint

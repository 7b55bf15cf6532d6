"""The whole loop with the gate on the tiny engine: corrections become an adapter that the
gate publishes (it beats the head on a suite and the holdout); then a second round with
wrong labels trains an adapter that the gate rejects — it loses today's suite and the
items that admitted the first release — and the head does not move."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.config import EvaluationConfig
from reef.evaluation import EvaluationStore
from reef.jobs import JobQueue
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

RIGHT, WRONG = "Squid-7", "Octo-3"
RECIPE = """\
schema_version: 1
trigger: {type: manual}
selection: {holdout_fraction: 0.25}
learners:
  - type: sft
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    steps: 120
    threads: 1
    replay: false  # round 2 shows the regression suite catching forgetting
    batch_size: 8
gate:
  suites: [suite.jsonl]
  scorer: {type: contains}
  min_items: 10
  max_tokens: 8
  concurrency: 4
publish: auto
"""


def _traffic(gateway: GatewayThread, prompts: list[str], correction: str) -> None:
    client = gateway.openai(**{"x-reef-scenario": "codes"})
    for prompt in prompts:
        raw = client.chat.completions.with_raw_response.create(
            model="reef/codes", messages=[{"role": "user", "content": prompt}], max_tokens=4
        )
        body = {
            "record_ids": [raw.headers["x-reef-record-id"]],
            "score": 0.0,
            "correction": correction,
        }
        assert call(gateway.port, "POST", "/reef/feedback", body).status == 201


def _learn(gateway: GatewayThread, worker: Worker) -> dict[str, Any]:
    assert call(gateway.port, "POST", "/reef/scenarios/codes/learn", {}).status == 202
    [job] = worker.run_once()
    assert job.state == "succeeded", job.as_dict()
    assert job.result is not None
    return job.result


def test_the_gate_publishes_corrections_and_rejects_wrong_labels(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    suite = [
        {"id": f"s{i}", "input": f"which code for case {i}?", "reference": RIGHT}
        for i in range(30, 42)  # cases the traffic (0-23) never asks about
    ]
    (tmp_path / "suite.jsonl").write_text("\n".join(json.dumps(item) for item in suite))
    with tiny_gateway(
        tmp_path, scenarios={"codes": {"upstream": "engine", "recipe": tmp_path / "recipe.yaml"}}
    ) as gateway:
        settings = gateway.settings
        chain = ReleaseChain(gateway.database)
        artifacts = open_artifact_store(settings.artifacts_url())
        gate_settings = settings.model_copy(
            update={"evaluation": EvaluationConfig(gateway_url=gateway.url)}
        )
        worker = Worker(
            gate_settings,
            gateway.store,
            chain,
            artifacts,
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        )
        base = chain.head("codes")
        assert base is not None

        # round 1: right corrections -> an adapter that says them -> published
        _traffic(gateway, [f"which code for case {i}?" for i in range(24)], RIGHT)
        first = _learn(gateway, worker)
        assert first["gate"]["action"] == "published", first["gate"]
        admitted = chain.head("codes")
        assert admitted is not None and admitted.parent_id == base.id
        assert admitted.manifest.model.adapter is not None
        decision = (admitted.evidence or {})["gate"]["decision"]
        assert decision["overall"]["candidate_mean"] > decision["overall"]["baseline_mean"]

        # round 2: a bad annotator's labels -> the adapter forgets -> rejected
        _traffic(gateway, [f"which code for ticket {i}?" for i in range(24)], WRONG)
        second = _learn(gateway, worker)
        assert second["gate"]["action"] == "rejected", second["gate"]
        assert "regression" in second["gate"]["decision"]
        head = chain.head("codes")
        assert head is not None and head.id == admitted.id
        rejected = chain.get_candidate(second["candidate_id"])
        assert rejected.state == "rejected"
        assert rejected.manifest.model.adapter != admitted.manifest.model.adapter

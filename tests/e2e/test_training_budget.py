"""Training budgets on the tiny engine, through the public path (gateway → feedback →
job): the learner trains epochs over what it was given, so twice the feedback is twice
the examples and about twice the steps, and on a task it can fit the validation loss
stops falling and training stops early."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.evaluation import EvaluationStore
from reef.jobs import JobQueue
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

RECIPE = """\
schema_version: 1
trigger: {type: manual}
selection: {holdout_fraction: 0.0}
gate: {enabled: false}
learners:
  - type: sft
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    batch_size: 8
    epochs: EPOCHS
    patience: 10   # the random tiny model plateaus for a few epochs before it learns
    threads: 1
"""


def learn(gateway: GatewayThread, worker: Worker, scenario: str, count: int) -> dict[str, Any]:
    client = gateway.openai(**{"x-reef-scenario": scenario})
    for case in range(count):
        raw = client.chat.completions.with_raw_response.create(
            model=f"reef/{scenario}",
            messages=[{"role": "user", "content": f"which code for case {case}?"}],
            max_tokens=4,
        )
        body = {"record_ids": [raw.headers["x-reef-record-id"]], "correction": "Squid-7"}
        assert call(gateway.port, "POST", "/reef/feedback", body).status == 201
    assert call(gateway.port, "POST", f"/reef/scenarios/{scenario}/learn", {}).status == 202
    [job] = worker.run_once()
    assert job.state == "succeeded", job.as_dict()
    assert job.result is not None
    metrics: dict[str, Any] = job.result["metrics"]["0:sft"]
    return metrics


def test_twice_the_feedback_is_twice_the_training_and_a_fit_stops_early(tmp_path: Path) -> None:
    scenarios: dict[str, Any] = {}
    for name, epochs in (("small", 5), ("large", 5), ("fit", 100)):
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(RECIPE.replace("EPOCHS", str(epochs)))
        scenarios[name] = {"upstream": "engine", "recipe": recipe}
    with tiny_gateway(tmp_path, scenarios=scenarios) as gateway:
        settings = gateway.settings
        chain = ReleaseChain(gateway.database)
        worker = Worker(
            settings,
            gateway.store,
            chain,
            open_artifact_store(settings.artifacts_url()),
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        )
        small = learn(gateway, worker, "small", 24)
        large = learn(gateway, worker, "large", 48)
        fit = learn(gateway, worker, "fit", 40)

    assert small["examples"] == 24 and large["examples"] == 48
    assert small["train_examples"] + small["val_examples"] == 24
    assert large["train_examples"] + large["val_examples"] == 48
    assert large["steps"] >= 1.8 * small["steps"]
    for metrics in (small, large):
        assert metrics["stop_reason"] in ("completed", "early_stopped")
        assert metrics["val_curve"] and metrics["undertrained"] in (True, False)
        assert len(metrics["loss_curve"]) == metrics["steps"]

    assert fit["stop_reason"] == "early_stopped"
    assert fit["steps"] < fit["steps_planned"]
    assert fit["undertrained"] is False
    assert fit["best_val_loss"] < fit["val_curve"][0][1] / 10

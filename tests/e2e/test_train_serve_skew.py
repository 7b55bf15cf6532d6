"""Train as served: a ``harness: managed`` scenario learns an arbitrary label map with the
simplest recipe (``fewshot`` then ``sft``) on the tiny engine.

With ``render_harness: false`` forced, the adapter is trained on the records' prompts,
which lack the system prompt and demos the gateway renders in; it fits them, then meets
both at serving time, and the skew check before the gate fails the job with both figures. With
the default, training renders the candidate's harness in, without the demos the
``fewshot`` learner chose (``demos: drop``), the candidate serves without them, and as
served it answers its training prompts as its trainer measured; with ``demos: keep`` it
trains and serves with them, as served again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.config import EvaluationConfig
from reef.evaluation import EvaluationStore
from reef.harness import Bundle, Harness, read_bundle_archive, write_bundle
from reef.jobs import Job, JobQueue
from reef.learning.skew import MAX_GAP
from reef.learning.worker import Worker
from reef.releases import Candidate, ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

# An arbitrary map from product to team: nothing in a word says its label.
TEAMS = {"kiwi": "ORION", "plum": "WILLOW", "fig": "CEDAR", "lime": "TALON"}
# What the application's developers wrote; the gateway renders it, then the demos.
SYSTEM = (
    "You route each customer order to the team that owns its product. "
    "Answer with the team code only, in capitals, and nothing else."
)
RECIPE = """\
schema_version: 1
trigger: {{type: manual}}
selection: {{holdout_fraction: 0.25, holdout_key: session}}
learners:
  - {{type: fewshot, k: 4}}
  - type: sft
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    steps: 200
    threads: 1
    batch_size: 8
{render}
gate: {{max_tokens: 8, safety: {{leak_probes: false}}}}
"""


def _traffic(gateway: GatewayThread) -> None:
    client = gateway.openai(**{"x-reef-scenario": "routing"})
    for i in range(8):
        for product, team in TEAMS.items():
            # Each request in a session named for it, and the holdout split by session:
            # the same items are trained on and held out in every run (split by record
            # id, which follows arrival, an unlucky split once served 7 of 8 right).
            raw = client.chat.completions.with_raw_response.create(
                model="reef/routing",
                messages=[{"role": "user", "content": f"route {product} order {i}"}],
                max_tokens=2,
                extra_headers={"x-reef-session": f"{product}-{i}"},
            )
            body = {"record_ids": [raw.headers["x-reef-record-id"]], "score": 0.0}
            body["correction"] = team
            assert call(gateway.port, "POST", "/reef/feedback", body).status == 201


def _learn(tmp_path: Path, render: str) -> tuple[Job, Candidate | None, int | None]:
    """Traffic, then one learning job of the recipe with ``render`` in its sft entry:
    the finished job, the candidate it proposed and the demos its harness serves."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(render=render))
    bundle = tmp_path / "harness"
    write_bundle(Bundle(harness=Harness(schema_version=1, system_prompt=SYSTEM), files={}), bundle)
    scenario = {
        "upstream": "engine",
        "recipe": recipe,
        "harness": "managed",
        "initial_harness": bundle,
    }
    with tiny_gateway(tmp_path, scenarios={"routing": scenario}) as gateway:
        _traffic(gateway)
        settings = gateway.settings.model_copy(
            update={"evaluation": EvaluationConfig(gateway_url=gateway.url)}
        )
        chain = ReleaseChain(gateway.database)
        artifacts = open_artifact_store(settings.artifacts_url())
        worker = Worker(
            settings,
            gateway.store,
            chain,
            artifacts,
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        )
        assert call(gateway.port, "POST", "/reef/scenarios/routing/learn", {}).status == 202
        [job] = worker.run_once()
        candidates = chain.candidates("routing")
        if not candidates:
            return job, None, None
        digest = candidates[0].manifest.harness
        assert digest is not None  # the system prompt at least
        demos = len(read_bundle_archive(artifacts.read_bytes(digest)).harness.examples)
        return job, candidates[0], demos


def _figures(job: Job) -> dict[str, Any]:
    metrics = job.metrics or {}
    return {"trained": metrics.get("trained_accuracy"), "served": metrics.get("served_accuracy")}


def test_training_without_the_harness_is_caught_before_the_gate(tmp_path: Path) -> None:
    job, candidate, demos = _learn(tmp_path, "    render_harness: false  # the records' prompts")
    figures = _figures(job)
    assert job.state == "failed", (job.as_dict(), figures)
    assert job.error is not None and job.error.startswith("train/serve skew:"), job.error
    assert "render_harness" in job.error
    assert figures["trained"] >= 0.8, figures
    assert figures["served"] < figures["trained"] - MAX_GAP, figures
    assert job.attempt == 1  # deterministic: not retried
    assert candidate is not None and candidate.state == "rejected"
    assert (candidate.evidence or {})["skew"]["served_accuracy"] == figures["served"]
    assert "gate" not in (candidate.evidence or {})  # the gate never spent a call
    assert demos == 4  # served with the demos it never trained under


@pytest.mark.parametrize("demos", ["drop", "keep"])
def test_by_default_a_managed_scenario_trains_as_served(tmp_path: Path, demos: str) -> None:
    # ``drop`` is the default: the recipe leaves it out.
    job, candidate, served_demos = _learn(tmp_path, "" if demos == "drop" else "    demos: keep")
    figures = _figures(job)
    assert job.state == "succeeded", (job.as_dict(), figures)
    assert job.result is not None
    skew = job.result["skew"]
    assert skew["skewed"] is False
    # Fitted, and served as trained; the forced run above served far less of the same
    # kind of prompts.
    assert skew["trained_accuracy"] >= 0.5, skew
    assert skew["served_accuracy"] >= skew["trained_accuracy"] - 0.125, skew
    assert figures == {"trained": skew["trained_accuracy"], "served": skew["served_accuracy"]}
    assert "gate" in job.result  # the gate ran after the check
    assert candidate is not None
    # The fewshot learner chose four demos; the adapter trained, and is served, without
    # them (drop) or with them (keep).
    assert served_demos == (0 if demos == "drop" else 4)
    assert job.metrics is not None and job.metrics["fewshot.demos"] == 4.0
    assert job.metrics.get("demos_dropped") == (4.0 if demos == "drop" else None)

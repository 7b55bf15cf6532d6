"""The model half of the loop on the tiny engine: traffic and corrections through the
gateway, one worker job running a harness learner and `sft`, one composite candidate
whose adapter moves held-out answers toward the corrections."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.evaluation import EvaluationStore
from reef.jobs import JobQueue
from reef.learning.selection import in_holdout
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.gateway.rawhttp import call

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

TARGET = "Squid-7"
RECIPE = """\
schema_version: 1
trigger: {type: manual}
selection: {holdout_fraction: 0.25}
gate: {enabled: false}  # candidates stay pending here; tests/e2e/test_gated_loop.py gates
learners:
  - {type: fewshot, k: 2}
  - type: sft
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    steps: 120
    threads: 1
    batch_size: 8
"""


def _answers(client, model_prompts: list[str], model: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=len(TARGET) + 1,
            temperature=0,
        )
        .choices[0]
        .message.content
        or ""
        for prompt in model_prompts
    ]


def test_corrections_become_an_adapter_that_says_them(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    with tiny_gateway(
        tmp_path, scenarios={"codes": {"upstream": "engine", "recipe": recipe}}
    ) as gateway:
        settings = gateway.settings
        client = gateway.openai(**{"x-reef-scenario": "codes"})
        prompts = [f"which code for case {i}?" for i in range(24)]
        records = {}
        for prompt in prompts:
            raw = client.chat.completions.with_raw_response.create(
                model="reef/codes",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=4,
            )
            records[prompt] = raw.headers["x-reef-record-id"]
        for record_id in records.values():
            body = {"record_ids": [record_id], "score": 0.0, "correction": TARGET}
            assert call(gateway.port, "POST", "/reef/feedback", body).status == 201
        assert call(gateway.port, "POST", "/reef/scenarios/codes/learn", {}).status == 202

        chain = ReleaseChain(gateway.database)
        artifacts = open_artifact_store(settings.artifacts_url())
        jobs = Worker(
            settings,
            gateway.store,
            chain,
            artifacts,
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        ).run_once()
        assert [job.state for job in jobs] == ["succeeded"], [j.as_dict() for j in jobs]
        (candidate,) = chain.candidates("codes")
        assert candidate.manifest.model.adapter is not None  # the model half
        assert candidate.manifest.harness is not None  # and the harness half, one candidate

        holdout = [p for p in prompts if in_holdout(records[p], 0.25)]
        assert holdout, "the split keeps some items out of training"
        consumed = set(JobQueue(gateway.database).consumed_by(jobs[0].id))
        assert not consumed & {records[p] for p in holdout}, "a holdout record was trained on"

        # serve the candidate by pinning it, and compare with the head on held-out prompts
        head = chain.head("codes")
        assert head is not None
        base_answers = _answers(client, holdout, "reef/codes")
        pinned = gateway.openai(**{"x-reef-scenario": "codes", "x-reef-release": candidate.id})
        tuned_answers = _answers(pinned, holdout, "reef/codes")
        base_hits = sum(answer.strip() == TARGET for answer in base_answers)
        tuned_hits = sum(answer.strip() == TARGET for answer in tuned_answers)
        assert base_hits == 0
        assert tuned_hits >= max(1, len(holdout) // 2), (tuned_answers, holdout)

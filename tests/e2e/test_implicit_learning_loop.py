"""Learning without a grader, on the tiny engine: users correct wrong answers in their
next message ("No, it's Squid-7, not that."), nobody posts feedback; the worker turns the
corrections into computed feedback, its trigger fires on them, `sft` trains an adapter
from them alone, and the gate (an operator's suite of prompts the traffic never asked)
publishes it; the published release then says the corrections."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.config import EvaluationConfig
from reef.evaluation import EvaluationStore
from reef.jobs import JobQueue
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway, until_serving
from tests.engine.lora_factory import PEFT_WRAP_WARNING

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

TARGET = "Squid-7"
RECIPE = """\
schema_version: 1
trigger: {type: min_new_feedback, count: 20}
signals: {enabled: [correction]}
selection: {holdout_fraction: 0.25}
learners:
  - type: sft
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    steps: 120
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


def test_next_turn_corrections_alone_train_a_published_adapter(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    suite = [
        {"id": f"s{i}", "input": f"which code for case {i}?", "reference": TARGET}
        for i in range(30, 42)  # cases the traffic (0-23) never asks about
    ]
    (tmp_path / "suite.jsonl").write_text("\n".join(json.dumps(item) for item in suite))
    with tiny_gateway(
        tmp_path, scenarios={"codes": {"upstream": "engine", "recipe": tmp_path / "recipe.yaml"}}
    ) as gateway:
        client = gateway.openai(**{"x-reef-scenario": "codes"})
        for i in range(24):
            asked = [{"role": "user", "content": f"which code for case {i}?"}]
            first = client.chat.completions.create(
                model="reef/codes", messages=asked, max_tokens=4
            )  # the tiny model's answer is never the code
            reply = first.choices[0].message.content or ""
            corrected = [
                *asked,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"No, it's {TARGET}, not that."},
            ]
            client.chat.completions.create(model="reef/codes", messages=corrected, max_tokens=4)
        assert gateway.store.list_feedback("codes", None, None, 10) == []  # nobody graded

        settings = gateway.settings.model_copy(
            update={"evaluation": EvaluationConfig(gateway_url=gateway.url)}
        )
        chain = ReleaseChain(gateway.database)
        base = chain.head("codes")
        worker = Worker(
            settings,
            gateway.store,
            chain,
            open_artifact_store(settings.artifacts_url()),
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        )
        [job] = worker.run_once()
        assert job.state == "succeeded", job.as_dict()
        assert job.input == {"trigger": "min_new_feedback"}  # fired by computed feedback
        assert job.result is not None and job.result["gate"]["action"] == "published", job.result
        stats = job.result["selection"]
        assert stats["computed_feedback"] == 24 and stats["train"] >= 12
        head = chain.head("codes")
        assert head is not None and base is not None and head.parent_id == base.id
        assert head.manifest.model.adapter is not None
        until_serving(gateway, "codes", head.id)  # else the first answers may be the base's

        tuned = gateway.openai(**{"x-reef-scenario": "codes"})
        answers = [
            tuned.chat.completions.create(
                model="reef/codes",
                messages=[{"role": "user", "content": item["input"]}],
                max_tokens=len(TARGET) + 1,
                temperature=0,
            )
            .choices[0]
            .message.content
            or ""
            for item in suite
        ]
        hits = sum(answer.strip() == TARGET for answer in answers)
        assert hits >= len(suite) // 2, answers

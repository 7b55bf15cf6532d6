"""Learning a tool call end to end on the tiny engine (issue 13): an agent offered a
``lookup_order`` tool answers with text; each session's outcome says it failed and
names the call it should have made. `sft` trains on those turns as the engine renders
them, the gate (a suite scored by ``tool_call``) publishes the adapter, and the engine
then answers held-out prompts with that call — parsed into ``tool_calls`` — where the
base model made none."""

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
from tests.gateway.rawhttp import call

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Find an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    },
}
RIGHT_CALL = {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}
RECIPE = """\
schema_version: 1
trigger: {type: manual}
selection: {holdout_fraction: 0}  # the gate asks its own suite
learners:
  - type: sft
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    steps: 200
    threads: 1
    batch_size: 8
    # the tiny model's tokenizer spells the tool prompt out character by character
    max_seq_len: 1024
gate:
  suites: [suite.jsonl]
  holdout: false
  min_items: 10
  max_tokens: 100
  concurrency: 4
publish: auto
"""


def ask(client: Any, prompt: str) -> Any:
    return client.chat.completions.with_raw_response.create(
        model="reef/orders",
        messages=[{"role": "user", "content": prompt}],
        tools=[LOOKUP],
        max_tokens=100,
        temperature=0,
    )


def test_outcomes_naming_the_right_call_teach_the_engine_to_make_it(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    suite = [
        {
            "id": f"s{i}",
            "input": f"where is my order, case {i}?",
            "reference": {"tool_calls": [RIGHT_CALL]},
            "scorer": {"type": "tool_call"},
            "params": {"tools": [LOOKUP]},
        }
        for i in range(30, 42)  # cases the traffic (0-23) never asks about
    ]
    (tmp_path / "suite.jsonl").write_text("\n".join(json.dumps(item) for item in suite))
    with tiny_gateway(
        tmp_path, scenarios={"orders": {"upstream": "engine", "recipe": tmp_path / "recipe.yaml"}}
    ) as gateway:
        client = gateway.openai(**{"x-reef-scenario": "orders"})
        for i in range(24):
            raw = ask(client, f"where is my order, case {i}?")
            assert not raw.parse().choices[0].message.tool_calls  # the base never calls
            outcome = {
                "session_id": raw.headers["x-reef-session-id"],
                "record_ids": [raw.headers["x-reef-record-id"]],
                "score": 0.0,
                "feedback": "should have looked the order up",
                "correction": {"tool_calls": [RIGHT_CALL]},
            }
            sent = call(
                gateway.port, "POST", "/reef/feedback", outcome, {"x-reef-scenario": "orders"}
            )
            assert sent.status == 201, sent.body

        settings = gateway.settings.model_copy(
            update={"evaluation": EvaluationConfig(gateway_url=gateway.url)}
        )
        chain = ReleaseChain(gateway.database)
        worker = Worker(
            settings,
            gateway.store,
            chain,
            open_artifact_store(settings.artifacts_url()),
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        )
        assert call(gateway.port, "POST", "/reef/scenarios/orders/learn", {}).status == 202
        [job] = worker.run_once()
        assert job.state == "succeeded", job.as_dict()
        assert job.result is not None
        if job.result["gate"]["action"] != "published":  # say what the candidate said
            pinned = gateway.openai(
                **{"x-reef-scenario": "orders", "x-reef-release": job.result["candidate_id"]}
            )
            said = [ask(pinned, item["input"]).parse().choices[0].message for item in suite]
            raise AssertionError((job.result["gate"], job.result["metrics"], said))
        head = chain.head("orders")
        assert head is not None and head.manifest.model.adapter is not None

        made = []
        for item in suite:
            message = ask(client, item["input"]).parse().choices[0].message
            made.append(
                [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
                if message.tool_calls
                else message.content
            )
        right = sum(m == [("lookup_order", {"order_id": "A1"})] for m in made)
        assert right >= len(suite) // 2, made

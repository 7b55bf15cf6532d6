"""An agent learns over two rounds on the tiny engine, and the gate decides both (issue 46).

Round 1 is first-turn traffic: a customer asks, the agent is offered ``lookup_order``, and
each session's feedback names the call it should have made. Round 2 is what an agent's
client tool loop sends next: the customer's question, the assistant's tool calls (two in
parallel, or one), the tool results (one of them an error) and the model's answer, graded
with the sentence it should have said. Reef stores those histories in its canonical form;
the gate replays the held-out ones through the gateway in OpenAI form, so every replay is
answered (none refused) and both rounds end in a decision.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.config import EvaluationConfig
from reef.evaluation import EvaluationStore
from reef.jobs import Job, JobQueue
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

SCENARIO = "orders"
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Find an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    },
}
RECIPE = """\
schema_version: 1
trigger: {type: manual}
selection: {holdout_fraction: 0.5}
learners:
  - type: sft
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    steps: 120
    threads: 1
    batch_size: 8
    max_seq_len: 1024
gate:
  holdout: true
  min_items: 4
  method: bootstrap  # a handful of held-out turns: the one-look rule decides them
  max_tokens: 100
  concurrency: 4
  retries: 0
publish: auto
"""


def call_of(order: str, call_id: str) -> dict[str, Any]:
    arguments = json.dumps({"order_id": order})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "lookup_order", "arguments": arguments},
    }


def history(i: int) -> list[dict[str, Any]]:
    """Round 2's conversation up to the model's answer: a question, the assistant's tool
    calls (two in parallel but for every fourth customer, so the held-out half holds
    some whatever the split) and their results (an error for every fifth)."""
    orders = [f"A{i}", f"B{i}"] if i % 4 != 1 else [f"A{i}"]
    calls = [call_of(order, f"call_{i}_{n}") for n, order in enumerate(orders)]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"where are my orders, case {i}?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    for n, order in enumerate(orders):
        result = {"error": "order service unavailable"} if i % 5 == 0 else {"status": "shipped"}
        content = json.dumps({"order_id": order, **result})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}_{n}", "content": content})
    return messages


def send(gateway: GatewayThread, messages: list[dict[str, Any]], feedback: dict[str, Any]) -> None:
    client = gateway.openai(**{"x-reef-scenario": SCENARIO})
    raw = client.chat.completions.with_raw_response.create(
        model=f"reef/{SCENARIO}", messages=messages, tools=[LOOKUP], max_tokens=24, temperature=0
    )
    body = {
        "session_id": raw.headers["x-reef-session-id"],
        "record_ids": [raw.headers["x-reef-record-id"]],
        **feedback,
    }
    sent = call(gateway.port, "POST", "/reef/feedback", body, {"x-reef-scenario": SCENARIO})
    assert sent.status == 201, sent.body


def learn(gateway: GatewayThread, worker: Worker) -> Job:
    assert call(gateway.port, "POST", f"/reef/scenarios/{SCENARIO}/learn", {}).status == 202
    [job] = worker.run_once()
    assert job.state == "succeeded", job.as_dict()
    assert job.attempt == 1, job.as_dict()
    return job


def test_an_agent_learns_over_two_rounds_and_the_gate_replays_its_tool_histories(
    tmp_path: Path,
) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    scenarios = {SCENARIO: {"upstream": "engine", "recipe": tmp_path / "recipe.yaml"}}
    with tiny_gateway(tmp_path, scenarios=scenarios) as gateway:
        settings = gateway.settings.model_copy(
            update={"evaluation": EvaluationConfig(gateway_url=gateway.url)}
        )
        chain = ReleaseChain(gateway.database)
        evaluations = EvaluationStore(gateway.database)
        worker = Worker(
            settings,
            gateway.store,
            chain,
            open_artifact_store(settings.artifacts_url()),
            queue=JobQueue(gateway.database),
            evaluations=evaluations,
        )
        for i in range(16):
            right = {"tool_calls": [call_of("A1", f"fix_{i}")]}
            question = [{"role": "user", "content": f"where is my order, case {i}?"}]
            send(gateway, question, {"score": 0.0, "correction": right})
        first = learn(gateway, worker)

        for i in range(16):
            said = "Your order is delayed." if i % 5 == 0 else "Your order has shipped."
            send(gateway, history(i), {"score": 0.0, "correction": said})
        head = chain.head(SCENARIO)  # round 1's release when its gate published, else the base
        assert head is not None
        second = learn(gateway, worker)

        for job in (first, second):
            assert job.result is not None
            assert job.result["gate"]["action"] in {"published", "rejected"}, job.result
        gate = second.result["gate"] if second.result else {}
        evaluation_id = gate["evaluation_id"]
        items = evaluations.items(evaluation_id)
        replayed = [i for i in items if any(m.get("role") == "tool" for m in i.messages)]
        assert replayed, [i.messages for i in items]  # held-out tool histories were asked
        parallel = [i for i in replayed for m in i.messages if len(m.get("tool_calls") or ()) == 2]
        assert parallel, [i.messages for i in replayed]
        results = evaluations.results(evaluation_id)
        assert len(items) >= 4 and len(results) == 2 * len(items)
        refused = [(r.item_key, r.arm, r.error) for r in results if r.error is not None]
        assert refused == []
        evaluation = evaluations.get(evaluation_id)
        assert evaluation.state == "done" and evaluation.decision is not None
        assert evaluation.baseline_id == head.id  # round 2 against what serves after round 1
        for job in (first, second):  # a decision on evidence, not on too few items
            assert job.result is not None and "insufficient" not in job.result["gate"]["decision"]

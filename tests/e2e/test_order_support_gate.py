"""examples/order-support/recipe.yaml's gate, as the worker builds it (its gate block,
its publish mode, its tasks file), through a real gateway: a candidate whose agent does
every task right passes against a head whose agent declines them all, on all 18 tasks,
twice per task and side, and waits for review.

Only the model is a fake: an agent that plays the right run of
tests/environments/test_order_support_example.py for the task its conversation opens
with when the release's system prompt says ``skilled``, and declines otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reef.evaluation import EvaluationStore, Gate, GatewayTarget
from reef.harness import Bundle, Harness, pack_bundle
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.environments.test_order_support_example import EXAMPLE, recipe, right_agent, tasks
from tests.fakes.scripted import ScriptedChatThread
from tests.gateway.harness import GatewayThread, make_settings

SCENARIO = "orders"


def agent(body: dict[str, Any]) -> dict[str, Any]:
    """The fake agent's next message (module docstring)."""
    messages = body.get("messages") or []
    system = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
    if "skilled" not in system:
        return {"content": "Sorry, I cannot help with that."}
    return right_agent(body)


def test_the_example_recipes_gate_passes_an_agent_that_does_every_task(tmp_path: Path) -> None:
    found = recipe()
    assert found.gate.episodes is not None
    with ScriptedChatThread([agent] * 10_000) as model:
        settings = make_settings(
            tmp_path,
            model.base_url,
            upstreams={"agent": {"type": "openai", "base_url": model.base_url, "model": "agent"}},
            scenarios={SCENARIO: {"upstream": "agent", "harness": "managed"}},
        )
        with GatewayThread(settings) as gateway:
            chain = ReleaseChain(gateway.database)
            artifacts = open_artifact_store(settings.artifacts_url())

            def manifest(prompt: str) -> ReleaseManifest:
                harness = Harness(schema_version=1, system_prompt=prompt)
                bundle = pack_bundle(Bundle(harness=harness, files={}))
                digest = artifacts.put_bytes(bundle, "harness")
                return ReleaseManifest(model=ModelComponent(base="agent"), harness=digest)

            head = chain.head(SCENARIO)
            assert head is not None
            base = chain.propose(SCENARIO, manifest("You help."), head.id, "test", "head")
            head = chain.publish(base.id, head.id, "test", "setup", require_passed=False)
            candidate = chain.propose(
                SCENARIO, manifest("You help, skilled."), head.id, "test", "candidate"
            )
            evaluations = EvaluationStore(chain.database)
            gate = Gate(
                config=found.gate,
                publish=found.publish,
                chain=chain,
                artifacts=artifacts,
                evaluations=evaluations,
                target=GatewayTarget(
                    base_url=gateway.url,
                    scenario=SCENARIO,
                    timeout_seconds=found.gate.timeout_seconds,
                    retries=found.gate.retries,
                    concurrency=found.gate.concurrency,
                ),
                suite_dir=EXAMPLE,
            )
            outcome = gate.run(candidate.id)

            assert outcome.action == "awaiting review", outcome  # publish: review
            assert chain.get_candidate(candidate.id).state == "passed"
            assert outcome.decision is not None and outcome.decision.overall is not None
            assert outcome.decision.overall.candidate_mean == 1.0
            assert outcome.decision.overall.baseline_mean == 0.0
            assert outcome.evaluation_id is not None
            episodes = evaluations.episodes(outcome.evaluation_id)
            repeats = found.gate.episodes.repeats
            assert len(episodes) == len(tasks()) * repeats * 2
            mine = [e for e in episodes if e.arm == "candidate"]
            assert all((e.score, e.stop) == (1.0, "finished") for e in mine)
            assert {e.task_id for e in mine} == set(tasks())

"""The gate on paired episodes end to end (issue 14): harness candidates play the
``python`` environment's order-support tasks through a real gateway, pinned to each
release with purpose ``eval``; the gate publishes a candidate that finishes more tasks
than the head, rejects one that finishes fewer, and stores every episode.

Only the model is a fake (a real OpenAI-compatible server on loopback): an agent that
handles the returns of the items its system prompt names (``handles: kettle, toaster``)
— it looks the order up, opens the return and says the return's id — and declines the
rest. The gateway renders each release's harness into that system prompt, so what a
release finishes follows from its harness deterministically; the gateway, the gate, the
environment (its tool worker included) and the store are all real."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef.evaluation import EvaluationStore, Gate, GateConfig, GatewayTarget
from reef.experience import Redactor
from reef.harness import Bundle, Harness, pack_bundle
from reef.releases import (
    ArtifactStore,
    Candidate,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    open_artifact_store,
)
from tests.fakes.scripted import ScriptedChatThread, calls, tool_call
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call

SCENARIO = "shop"
ITEMS = ["kettle", "toaster", "blender", "lamp", "fan", "radio"]
REQUEST = re.compile(r"My (\w+) from order (\w+) is broken")


def agent(body: dict[str, Any]) -> dict[str, Any]:
    """The fake agent's next message (module docstring)."""
    messages = body.get("messages") or []
    system = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
    handles = {
        word.strip()
        for line in system.splitlines()
        if line.startswith("handles:")
        for word in line.removeprefix("handles:").split(",")
    }
    users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    found = REQUEST.search(users[0]) if users else None
    if found is None or found.group(1) not in handles:
        return {"content": "Sorry, I cannot help with that."}
    order = found.group(2)
    results = sum(m.get("role") == "tool" for m in messages)
    if results == 0:
        return calls(tool_call("c1", "lookup_order", {"order_id": order}))
    if results == 1:
        return calls(tool_call("c2", "open_return", {"order_id": order, "reason": "broken"}))
    return {"content": f"Your return R-{order} is open."}


def write_tasks(path: Path) -> None:
    lines = []
    for n, item in enumerate(ITEMS):
        order = f"B{n}"
        lines.append(
            {
                "id": f"return-{item}",
                "prompt": f"My {item} from order {order} is broken, please take it back.",
                "expected": {"return_opened": order, "answer_contains": [f"R-{order}"]},
                "setup": {
                    "orders": {
                        order: {"status": "delivered", "item": item, "days_since_delivery": 3}
                    },
                    "stock": {item: 1},
                },
            }
        )
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")


@dataclass
class Shop:
    tmp: Path
    model: ScriptedChatThread
    gateway: GatewayThread
    chain: ReleaseChain
    artifacts: ArtifactStore
    redactor: Redactor

    @property
    def evaluations(self) -> EvaluationStore:
        """The gate's store, built as ``build_worker`` builds it (with the configured
        ``capture.redact_patterns``)."""
        return EvaluationStore(self.chain.database, self.redactor)

    def head(self) -> Release:
        head = self.chain.head(SCENARIO)
        assert head is not None
        return head

    def propose(self, handles: list[str]) -> Candidate:
        prompt = f"You help with returns.\nhandles: {', '.join(handles)}"
        harness = Harness(schema_version=1, system_prompt=prompt)
        digest = self.artifacts.put_bytes(pack_bundle(Bundle(harness=harness, files={})), "harness")
        manifest = ReleaseManifest(model=ModelComponent(base="agent"), harness=digest)
        return self.chain.propose(SCENARIO, manifest, self.head().id, "test", "a harness")

    def publish_directly(self, handles: list[str]) -> Release:
        candidate = self.propose(handles)
        return self.chain.publish(
            candidate.id, self.head().id, "test", "setup", require_passed=False
        )

    def gate(self) -> Gate:
        config = GateConfig(
            holdout=False,
            min_items=len(ITEMS),
            # six tasks are too few for the sequential rule; the one-look rule decides them
            method="bootstrap",
            max_tokens=64,
            episodes={
                "environment": {"type": "python", "toolset": "orders", "tasks": "tasks.jsonl"},
                "repeats": 2,
                "max_turns": 5,
            },
        )
        target = GatewayTarget(base_url=self.gateway.url, scenario=SCENARIO, concurrency=1)
        return Gate(
            config=config,
            publish="auto",
            chain=self.chain,
            artifacts=self.artifacts,
            evaluations=self.evaluations,
            target=target,
            suite_dir=self.tmp,
        )


@contextmanager
def shop(tmp: Path, redact_patterns: tuple[str, ...] = ()) -> Iterator[Shop]:
    write_tasks(tmp / "tasks.jsonl")
    with ScriptedChatThread([agent] * 1000) as model:
        settings = make_settings(
            tmp,
            model.base_url,
            upstreams={"agent": {"type": "openai", "base_url": model.base_url, "model": "agent"}},
            scenarios={SCENARIO: {"upstream": "agent", "harness": "managed"}},
            activation={"poll_interval_seconds": 0.05},
            capture={"redact_patterns": list(redact_patterns)},
        )
        with GatewayThread(settings) as gateway:
            chain = ReleaseChain(gateway.database)
            artifacts = open_artifact_store(settings.artifacts_url())
            redactor = Redactor(settings.capture.redact_patterns)
            yield Shop(tmp, model, gateway, chain, artifacts, redactor)


def test_the_gate_publishes_a_candidate_that_finishes_more_tasks(tmp_path: Path) -> None:
    with shop(tmp_path) as world:
        base = world.publish_directly(ITEMS[:2])
        candidate = world.propose(ITEMS)
        outcome = world.gate().run(candidate.id)

        assert outcome.action == "published", outcome
        assert world.head().id == outcome.release_id
        assert outcome.decision is not None and outcome.decision.overall is not None
        assert outcome.decision.overall.candidate_mean == 1.0
        assert abs(outcome.decision.overall.baseline_mean - 2 / 6) < 1e-9
        assert outcome.evaluation_id is not None
        episodes = world.evaluations.episodes(outcome.evaluation_id)
        assert len(episodes) == len(ITEMS) * 2 * 2  # tasks x repeats x sides
        mine = [e for e in episodes if e.arm == "candidate"]
        assert {e.release_id for e in mine} == {candidate.id}
        assert all(e.score == 1.0 and e.stop == "finished" for e in mine)
        assert all(e.turns == 3 and e.tool_calls == 2 for e in mine)
        theirs = {e.task_id: e for e in episodes if e.arm == "baseline" and e.repeat == 0}
        kettle = theirs["return-kettle"]
        assert (kettle.score, kettle.release_id) == (1.0, base.id)
        declined = theirs["return-radio"]
        assert (declined.score, declined.turns, declined.tool_calls) == (0.0, 1, 0)
        assert declined.reason is not None and "no return was opened for B5" in declined.reason

        # every model call went through the gateway pinned to its side, purpose eval,
        # and each episode is one recorded session
        for episode in (mine[0], declined):
            records = world.gateway.store.get_session(SCENARIO, episode.session_id or "")
            assert [r.id for r in records] == episode.record_ids
            assert {(r.purpose, r.release_id) for r in records} == {("eval", episode.release_id)}
        # interleaved: one at a time, candidate then head, per task and repeat
        order = sorted(episodes, key=lambda e: e.record_ids[0])
        assert [e.arm for e in order] == ["candidate", "baseline"] * (len(episodes) // 2)
        assert [(e.task_id, e.repeat) for e in order[::2]] == [
            (f"return-{item}", r) for item in ITEMS for r in range(2)
        ]

        # the admin API shows the episodes, and one task's both sides with conversations
        shown = call(world.gateway.port, "GET", f"/reef/evaluations/{outcome.evaluation_id}")
        assert shown.status == 200, shown.body
        rows = json.loads(shown.body)["episodes"]
        assert len(rows) == len(episodes) and "messages" not in rows[0]
        path = f"/reef/evaluations/{outcome.evaluation_id}/episodes?task=return-radio"
        both = json.loads(call(world.gateway.port, "GET", path).body)["data"]
        assert [(e["arm"], e["repeat"]) for e in both] == [
            ("candidate", 0),
            ("baseline", 0),
            ("candidate", 1),
            ("baseline", 1),
        ]
        assert both[0]["messages"][-1]["content"] == "Your return R-B5 is open."


def test_the_gate_rejects_a_candidate_that_finishes_fewer_tasks(tmp_path: Path) -> None:
    # with a redaction pattern on the return ids the head's answers name (R-B0, R-B1)
    with shop(tmp_path, redact_patterns=(r"R-B\d",)) as world:
        base = world.publish_directly(ITEMS[:2])
        candidate = world.propose([])
        outcome = world.gate().run(candidate.id)

        assert outcome.action == "rejected", outcome
        assert world.head().id == base.id
        assert world.chain.get_candidate(candidate.id).state == "rejected"
        assert outcome.evaluation_id is not None
        episodes = world.evaluations.episodes(outcome.evaluation_id)
        assert len(episodes) == len(ITEMS) * 2 * 2
        assert all(e.score == 0.0 for e in episodes if e.arm == "candidate")
        finished = {e.task_id for e in episodes if e.arm == "baseline" and e.score == 1.0}
        assert finished == {"return-kettle", "return-toaster"}
        results = world.evaluations.results(outcome.evaluation_id)
        assert {r.suite for r in results} >= {"env:python"}

        # scored on what the model said (the head finished two tasks, by the return ids
        # in its answers), but stored redacted: the episodes' conversations and the
        # results' outputs, as the gateway's records of the same calls are
        kettle = next(e for e in episodes if e.task_id == "return-kettle" and e.arm == "baseline")
        assert kettle.messages[-1]["content"] == "Your return [REDACTED] is open."
        stored = json.dumps([[e.messages, e.error, e.reason] for e in episodes])
        stored += json.dumps([[r.output, r.error, r.details] for r in results])
        assert re.search(r"R-B\d", stored) is None
        (record,) = world.gateway.store.get_session(SCENARIO, kettle.session_id or "")[-1:]
        assert "R-B0" not in json.dumps(record.response)

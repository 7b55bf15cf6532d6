"""A scenario served through a real gateway in front of the oracle upstream, whose
answers come from the harness's system prompt: harness candidates that know more facts
answer more quiz items right."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef.evaluation.config import GateConfig
from reef.evaluation.gate import Gate, PublishMode
from reef.evaluation.results import EvaluationStore
from reef.evaluation.runner import GatewayTarget
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
from tests.fakes.oracle import OracleUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

SCENARIO = "quiz"


def fact(i: int) -> str:
    """The oracle's fact line for question ``i``."""
    return f"capital {i} => answer-{i}"


def write_suite(path: Path, questions: range) -> Path:
    """A JSONL quiz suite asking ``questions``."""
    lines = [
        json.dumps({"id": f"q{i}", "input": f"Q: capital {i}", "reference": f"answer-{i}"})
        for i in questions
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class QuizWorld:
    """The gateway, the chain and helpers to make harness candidates."""

    tmp: Path
    oracle: OracleUpstreamThread
    gateway: GatewayThread
    chain: ReleaseChain
    artifacts: ArtifactStore

    @property
    def evaluations(self) -> EvaluationStore:
        return EvaluationStore(self.chain.database)

    def manifest(self, facts: list[str], extra: str = "") -> ReleaseManifest:
        prompt = "\n".join([*facts, extra]).strip()
        harness = Harness(schema_version=1, system_prompt=prompt or None)
        digest = self.artifacts.put_bytes(pack_bundle(Bundle(harness=harness, files={})), "harness")
        return ReleaseManifest(model=ModelComponent(base="oracle", adapter=None), harness=digest)

    def propose(self, facts: list[str], extra: str = "") -> Candidate:
        head = self.head()
        return self.chain.propose(
            SCENARIO, self.manifest(facts, extra), head.id, "test", "a test candidate"
        )

    def publish_directly(self, facts: list[str]) -> Release:
        """Make ``facts`` the head without the gate (an operator's manual publish)."""
        candidate = self.propose(facts)
        return self.chain.publish(
            candidate.id, self.head().id, "test", "setup", require_passed=False
        )

    def head(self) -> Release:
        head = self.chain.head(SCENARIO)
        assert head is not None
        return head

    def gate(self, publish: PublishMode = "auto", **config: Any) -> Gate:
        settings: dict[str, Any] = {"holdout": False, "min_items": 10, "max_tokens": 16}
        settings.update(config)
        return Gate(
            config=GateConfig(**settings),
            publish=publish,
            chain=self.chain,
            artifacts=self.artifacts,
            evaluations=self.evaluations,
            target=GatewayTarget(base_url=self.gateway.url, scenario=SCENARIO, concurrency=4),
            suite_dir=self.tmp,
        )


@contextmanager
def quiz_world(
    tmp: Path,
    leaky: bool = False,
    auth: dict[str, Any] | None = None,
    oracle_thread: OracleUpstreamThread | None = None,
) -> Iterator[QuizWorld]:
    """The running world; the scenario's head knows no facts. ``auth``: the gateway's
    ``auth`` settings (none: no keys); ``oracle_thread``: another oracle to serve."""
    with oracle_thread or OracleUpstreamThread(leaky=leaky) as oracle:
        settings = make_settings(
            tmp,
            oracle.base_url,
            upstreams={
                "oracle": {"type": "openai", "base_url": oracle.base_url, "model": "oracle"}
            },
            scenarios={SCENARIO: {"upstream": "oracle", "harness": "managed"}},
            activation={"poll_interval_seconds": 0.05},
            **({} if auth is None else {"auth": auth}),
        )
        with GatewayThread(settings) as gateway:
            chain = ReleaseChain(gateway.database)
            artifacts = open_artifact_store(settings.artifacts_url())
            yield QuizWorld(tmp, oracle, gateway, chain, artifacts)

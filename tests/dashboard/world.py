"""A gateway with real data for the dashboard: a quiz scenario served through the oracle
upstream (its knowledge is the harness's system prompt), live traffic with feedback,
candidates through the real evaluation gate (two published, one rejected, one pending),
a rollback, and a learning job in progress. Keys are configured, so the admin path is
the authenticated one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reef.evaluation.config import GateConfig
from reef.evaluation.gate import Gate
from reef.evaluation.results import EvaluationStore
from reef.evaluation.runner import GatewayTarget
from reef.experience.jobs import JobQueue
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
from tests.evaluation.gate_setup import fact, write_suite
from tests.fakes.oracle import OracleUpstreamThread
from tests.gateway import rawhttp
from tests.gateway.harness import GatewayThread, make_settings

SCENARIO = "quiz"
ADMIN_KEY = "admin-secret-key"
INFERENCE_KEY = "inference-secret-key"
LOSS = [2.31, 1.74, 1.22, 0.93, 0.71, 0.64]


@dataclass
class DashboardWorld:
    """The running gateway and what was made in it (ids for assertions)."""

    gateway: GatewayThread
    chain: ReleaseChain
    artifacts: ArtifactStore
    suite_dir: Path
    releases: list[Release] = field(default_factory=list)
    published: Candidate | None = None
    rejected: Candidate | None = None
    pending: Candidate | None = None
    evaluation_id: str | None = None
    rejected_reason: str = ""

    @property
    def url(self) -> str:
        return self.gateway.url

    def admin(self, path: str) -> Any:
        """GET an admin route with the admin key; the JSON body (asserts 200)."""
        response = rawhttp.call(
            self.gateway.port, "GET", path, headers={"authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert response.status == 200, (path, response.status, response.body[:300])
        return response.json()

    def manifest(self, facts: list[str], extra: str = "") -> ReleaseManifest:
        prompt = "\n".join([*facts, extra]).strip()
        harness = Harness(schema_version=1, system_prompt=prompt or None)
        digest = self.artifacts.put_bytes(pack_bundle(Bundle(harness=harness, files={})), "harness")
        return ReleaseManifest(model=ModelComponent(base="oracle", adapter=None), harness=digest)

    def head(self) -> Release:
        head = self.chain.head(SCENARIO)
        assert head is not None
        return head

    def propose(self, facts: list[str], evidence: dict[str, Any] | None = None) -> Candidate:
        return self.chain.propose(
            SCENARIO,
            self.manifest(facts),
            self.head().id,
            "worker:test",
            "learning job (recipe quiz)",
            evidence=evidence,
        )

    def gate(self) -> Gate:
        return Gate(
            config=GateConfig(holdout=False, min_items=10, max_tokens=16, suites=["quiz.jsonl"]),
            publish="auto",
            chain=self.chain,
            artifacts=self.artifacts,
            evaluations=EvaluationStore(self.chain.engine),
            target=GatewayTarget(
                base_url=self.gateway.url, scenario=SCENARIO, api_key=INFERENCE_KEY
            ),
            suite_dir=self.suite_dir,
        )

    def wait_serving(self, release_id: str) -> None:
        """Until the gateway serves ``release_id`` (activation polls every 50 ms)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = self.admin("/reef/status")["scenarios"].get(SCENARIO) or {}
            if status.get("serving_release_id") == release_id:
                return
            time.sleep(0.05)
        raise AssertionError(f"the gateway did not start serving {release_id}")

    def traffic(self, questions: range, score: Any) -> None:
        """Ask each question live, then post feedback ``score(i, answer)``."""
        client = self.gateway.openai(api_key=INFERENCE_KEY)
        for i in questions:
            raw = client.chat.completions.with_raw_response.create(
                model=f"reef/{SCENARIO}", messages=[{"role": "user", "content": f"Q: capital {i}"}]
            )
            answer = raw.parse().choices[0].message.content or ""
            right = answer == f"answer-{i}"
            body: dict[str, Any] = {
                "record_ids": [raw.headers["x-reef-record-id"]],
                "score": score(i, right),
                "feedback": "right" if right else "wrong answer",
            }
            if not right:
                body["correction"] = f"answer-{i}"
            sent = rawhttp.call(
                self.gateway.port,
                "POST",
                "/reef/feedback",
                body,
                {"authorization": f"Bearer {INFERENCE_KEY}"},
            )
            assert sent.status == 201, sent.body


def _populate(world: DashboardWorld) -> None:
    chain = world.chain
    first = world.head()
    world.traffic(range(4), lambda i, right: 1.0 if right else 0.0)

    learned = world.propose(
        [fact(i) for i in range(12)],
        evidence={
            "job_id": "job-fewshot-1",
            "recipe": "quiz",
            "consumed": 4,
            "trained_from": first.id,
            "stale": False,
            "metrics": {
                "0:sft": {"loss_curve": LOSS, "examples": 4, "tokens": 512, "seconds": 1.5},
                "reported": {"loss": LOSS},
            },
        },
    )
    outcome = world.gate().run(learned.id)
    assert outcome.action == "published", outcome
    world.published = chain.get_candidate(learned.id)
    world.evaluation_id = outcome.evaluation_id
    world.wait_serving(world.head().id)
    world.traffic(range(6, 16), lambda i, right: 1.0 if right else 0.0)

    forgetful = world.propose([fact(i) for i in range(3)], evidence={"recipe": "quiz"})
    outcome = world.gate().run(forgetful.id)
    assert outcome.action == "rejected", outcome
    world.rejected = chain.get_candidate(forgetful.id)
    assert outcome.decision is not None
    world.rejected_reason = outcome.decision.reasons[0]

    better = world.propose([fact(i) for i in range(30)], evidence={"recipe": "quiz"})
    assert world.gate().run(better.id).action == "published"
    world.wait_serving(world.head().id)
    world.traffic(range(10, 20), lambda i, right: 1.0 if right else 0.0)

    second = chain.releases(SCENARIO)[1]
    back = chain.rollback(SCENARIO, second.id, world.head().id, "cli:ops", "check the old prompt")
    world.wait_serving(back.id)
    world.traffic(range(10, 14), lambda i, right: 1.0 if right else 0.0)
    world.pending = world.propose([fact(i) for i in range(40)])

    queue = JobQueue(chain.engine)
    queue.enqueue(SCENARIO, "learn", {"trigger": "manual", "requested_by": "api:ops"})
    job = queue.claim("worker-1", lease_seconds=600)
    assert job is not None
    queue.progress(job.id, "worker-1", 0.5, "0:sft: step 3/6 loss 1.2200", {"loss": LOSS[:3]})
    world.releases = list(reversed(chain.releases(SCENARIO)))


@contextmanager
def dashboard_world(tmp: Path) -> Iterator[DashboardWorld]:
    """The populated world (see the module docstring)."""
    tmp.mkdir(parents=True, exist_ok=True)
    write_suite(tmp / "quiz.jsonl", range(30))
    with OracleUpstreamThread() as oracle:
        settings = make_settings(
            tmp,
            oracle.base_url,
            upstreams={
                "oracle": {"type": "openai", "base_url": oracle.base_url, "model": "oracle"}
            },
            scenarios={SCENARIO: {"upstream": "oracle", "harness": "managed"}},
            activation={"poll_interval_seconds": 0.05},
            auth={
                "keys": [
                    {"id": "ops", "key": ADMIN_KEY, "role": "admin"},
                    {"id": "app", "key": INFERENCE_KEY, "role": "inference"},
                ]
            },
        )
        with GatewayThread(settings) as gateway:
            chain = ReleaseChain(gateway.store.engine)
            artifacts = open_artifact_store(settings.artifacts_url())
            world = DashboardWorld(gateway, chain, artifacts, tmp)
            _populate(world)
            yield world

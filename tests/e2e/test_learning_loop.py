"""The loop on real parts: traffic and feedback through the gateway, a manual learn
request, a worker run, and a candidate whose harness holds the best demonstrations."""

from __future__ import annotations

from pathlib import Path

from reef.evaluation import EvaluationStore
from reef.harness import read_bundle_archive
from reef.jobs import JobQueue
from reef.learning.selection import in_holdout
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call

RECIPE = """\
schema_version: 1
trigger: {type: manual}
selection: {holdout_fraction: 0.25}
gate: {enabled: false}  # candidates stay pending here; tests/e2e/test_gated_loop.py gates
learners:
  - {type: fewshot, k: 3}
"""


def test_feedback_becomes_a_fewshot_candidate(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    with FakeUpstreamThread() as fake:
        settings = make_settings(
            tmp_path, fake.base_url, scenarios={"triage": {"upstream": "fake", "recipe": recipe}}
        )
        with GatewayThread(settings) as gateway:
            client = gateway.openai()
            ids = {}
            for i in range(16):
                text = (
                    f"ticket {i}: my invoice {i} is wrong"
                    if i % 2
                    else f"ticket {i}: router {i} broken"
                )
                raw = client.chat.completions.with_raw_response.create(
                    model="reef/triage", messages=[{"role": "user", "content": text}]
                )
                ids[i] = raw.headers["x-reef-record-id"]
            for i, record_id in ids.items():
                body: dict[str, object] = {
                    "record_ids": [record_id],
                    "score": 1.0 if i < 8 else 0.0,
                }
                if i >= 8:
                    body["correction"] = "billing" if i % 2 else "hardware"
                assert call(gateway.port, "POST", "/reef/feedback", body).status == 201

            queued = call(gateway.port, "POST", "/reef/scenarios/triage/learn", {})
            assert queued.status == 202, queued.body
            again = call(gateway.port, "POST", "/reef/scenarios/triage/learn", {})
            assert again.json()["id"] == queued.json()["id"]  # never two jobs at once

            chain = ReleaseChain(gateway.database)
            artifacts = open_artifact_store(settings.artifacts_url())
            worker = Worker(
                settings,
                gateway.store,
                chain,
                artifacts,
                poll_seconds=0.1,
                queue=JobQueue(gateway.database),
                evaluations=EvaluationStore(gateway.database),
            )
            jobs = worker.run_once()
            assert [job.state for job in jobs] == ["succeeded"], [j.as_dict() for j in jobs]
            candidates = chain.candidates("triage")
            assert len(candidates) == 1
            candidate = candidates[0]
            assert candidate.manifest.harness is not None
            harness = read_bundle_archive(artifacts.read_bytes(candidate.manifest.harness)).harness
            assert 1 <= len(harness.examples) <= 3
            used = {tag.removeprefix("record:") for ex in harness.examples for tag in ex.tags}
            holdout = {rid for rid in ids.values() if in_holdout(rid, 0.25)}
            assert used and used <= set(ids.values())
            assert not used & holdout, "a holdout record became a demonstration"
            job_id = candidate.evidence["job_id"] if candidate.evidence else None
            consumed = set(JobQueue(gateway.database).consumed_by(job_id))
            assert consumed == used and not consumed & holdout
            # corrections outrank plain good scores as demonstrations
            answers = [ex.messages[-1]["content"] for ex in harness.examples]
            assert any(answer in ("billing", "hardware") for answer in answers), answers

            # once published, the records it consumed are not trained on again
            head = chain.head("triage")
            assert head is not None
            chain.publish(candidate.id, head.id, "test", "publish", require_passed=False)
            assert call(gateway.port, "POST", "/reef/scenarios/triage/learn", {}).status == 202
            second_jobs = Worker(
                settings,
                gateway.store,
                chain,
                artifacts,
                queue=JobQueue(gateway.database),
                evaluations=EvaluationStore(gateway.database),
            ).run_once()
            assert [job.state for job in second_jobs] == ["succeeded"]
            second = set(JobQueue(gateway.database).consumed_by(second_jobs[0].id))
            assert second and not second & consumed, "consumed records were reused"

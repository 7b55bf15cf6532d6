"""The loop on Responses traffic alone, on the tiny engine: every exchange comes through
``POST /v1/responses`` (plain and streamed; the receipts read from the headers and from
the streams' terminal events), corrections name those receipts, a worker trains an
adapter that the gate publishes, and the next Responses call is served by it: its
release id is the new head and it says the corrections."""

from __future__ import annotations

import json
import os
from pathlib import Path

import openai
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.config import EvaluationConfig
from reef.evaluation import EvaluationStore
from reef.experience import RecordFilter
from reef.jobs import JobQueue
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.gateway.rawhttp import call
from tests.polling import eventually

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

TARGET = "Squid-7"
RECIPE = """\
schema_version: 1
trigger: {type: manual}
selection: {holdout_fraction: 0.25}
learners:
  - type: sft
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    steps: 120
    threads: 1
    batch_size: 8
    seed: 7
gate:
  suites: [suite.jsonl]
  scorer: {type: contains}
  min_items: 10
  max_tokens: 8
  concurrency: 4
publish: auto
"""


def _ask(client: openai.OpenAI, prompt: str, stream: bool) -> tuple[str, str, str]:
    """One Responses turn: its answer, release id and record id (a stream's from its
    terminal event alone)."""
    settings = {"model": "reef/codes", "input": prompt, "max_output_tokens": 8, "temperature": 0}
    if not stream:
        raw = client.responses.with_raw_response.create(**settings)
        headers = raw.headers
        return raw.parse().output_text, headers["x-reef-release-id"], headers["x-reef-record-id"]
    final = list(client.responses.create(**settings, stream=True))[-1]
    assert final.type in ("response.completed", "response.incomplete"), final
    receipt = final.x_reef
    return final.response.output_text, receipt["release_id"], receipt["record_id"]


def test_responses_traffic_and_corrections_become_the_release_that_serves_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    suite = [
        {"id": f"s{i}", "input": f"which code for case {i}?", "reference": TARGET}
        for i in range(30, 42)  # cases the traffic (0-23) never asks about
    ]
    (tmp_path / "suite.jsonl").write_text("\n".join(json.dumps(item) for item in suite))
    with tiny_gateway(
        tmp_path, scenarios={"codes": {"upstream": "engine", "recipe": tmp_path / "recipe.yaml"}}
    ) as gateway:
        settings = gateway.settings
        chain = ReleaseChain(gateway.database)
        base = chain.head("codes")
        assert base is not None
        client = gateway.openai()

        for i in range(24):
            answer, release, record_id = _ask(client, f"which code for case {i}?", i % 2 == 1)
            assert release == base.id and TARGET not in answer
            body = {"record_ids": [record_id], "score": 0.0, "correction": TARGET}
            assert call(gateway.port, "POST", "/reef/feedback", body).status == 201
        records = gateway.store.list_records("codes", RecordFilter(), None, 50).records
        assert len(records) == 24 and {r.api for r in records} == {"openai.responses"}

        assert call(gateway.port, "POST", "/reef/scenarios/codes/learn", {}).status == 202
        worker = Worker(
            settings.model_copy(update={"evaluation": EvaluationConfig(gateway_url=gateway.url)}),
            gateway.store,
            chain,
            open_artifact_store(settings.artifacts_url()),
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        )
        [job] = worker.run_once()
        assert job.state == "succeeded", job.as_dict()
        assert job.result is not None and job.result["gate"]["action"] == "published", job.result
        head = chain.head("codes")
        assert head is not None and head.parent_id == base.id
        assert head.manifest.model.adapter is not None

        # the gateway follows the head; the next Responses calls are served by it
        eventually(
            lambda: _ask(client, "which code for case 50?", False)[1] == head.id,
            "the gateway to serve the published release",
        )
        for i, stream in ((51, False), (52, True), (53, False), (54, True)):
            answer, release, _ = _ask(client, f"which code for case {i}?", stream)
            assert release == head.id
            assert answer.strip() == TARGET, (i, answer)

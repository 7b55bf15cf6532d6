"""History brought in from OpenTelemetry: 240 graded conversations in an OTLP/JSON file
(GenAI spans, ``gen_ai.evaluation.result`` events carrying scores and corrections) are
imported into a scenario that has served no traffic, and the learning loop on the tiny
engine trains on them, gates the candidate and publishes it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.config import EvaluationConfig
from reef.evaluation import EvaluationStore
from reef.experience import ORIGIN_TAG, ImportOptions, ImportSummary, import_file
from reef.experience.importing.otel import otlp_attributes
from reef.jobs import JobQueue
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.gateway.rawhttp import call

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

RIGHT = "Squid-7"
CONVERSATIONS = 240
RECIPE = """\
schema_version: 1
trigger: {type: manual}
selection: {holdout_fraction: 0.1}
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
T0 = 1_733_300_000_000_000_000  # ns


def _span(trace: int, span: int, attributes: dict[str, Any], **extra: Any) -> dict[str, Any]:
    start = T0 + trace * 1_000_000_000
    return {
        "traceId": f"{trace:032x}",
        "spanId": f"{span:016x}",
        "kind": 3,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 300_000_000),
        "attributes": otlp_attributes(attributes),
        "status": {},
        **extra,
    }


def _evaluation(trace: int, correction: str) -> dict[str, Any]:
    attributes = {
        "gen_ai.evaluation.name": "support_review",
        "gen_ai.evaluation.score.value": 0.0,
        "gen_ai.evaluation.score.label": "wrong_code",
        "reef.feedback.correction": correction,
    }
    return {
        "timeUnixNano": str(T0 + trace * 1_000_000_000 + 500_000_000),
        "name": "gen_ai.evaluation.result",
        "attributes": otlp_attributes(attributes),
    }


def write_otel_history(path: Path) -> None:
    """240 chat spans as the Collector's file exporter writes them, 40 per export
    request; half carry their evaluation event, the other half are graded by an
    evaluator's own span (a child of the chat span) in a later request."""
    chats: list[dict[str, Any]] = []
    graders: list[dict[str, Any]] = []
    for i in range(CONVERSATIONS):
        trace = i + 1
        prompt = [
            {"role": "user", "parts": [{"type": "text", "content": f"which code for case {i}?"}]}
        ]
        answer = [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": "I am not sure."}],
                "finish_reason": "stop",
            }
        ]
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.conversation.id": f"conv-{i}",
            "gen_ai.input.messages": json.dumps(prompt),
            "gen_ai.output.messages": json.dumps(answer),
            "gen_ai.usage.input_tokens": 9,
            "gen_ai.usage.output_tokens": 5,
        }
        if i % 2:
            chats.append(
                _span(
                    trace,
                    1,
                    attributes,
                    name="chat gpt-4o-mini",
                    events=[_evaluation(trace, RIGHT)],
                )
            )
        else:
            chats.append(_span(trace, 1, attributes, name="chat gpt-4o-mini"))
            graders.append(
                _span(
                    trace,
                    2,
                    {},
                    name="evaluation",
                    parentSpanId=f"{1:016x}",
                    events=[_evaluation(trace, RIGHT)],
                )
            )
    spans = chats + graders
    with path.open("w") as out:
        for start in range(0, len(spans), 40):
            request = {
                "resourceSpans": [
                    {
                        "resource": {
                            "attributes": otlp_attributes({"service.name": "support-bot"})
                        },
                        "scopeSpans": [
                            {
                                "scope": {"name": "opentelemetry.instrumentation.openai_v2"},
                                "spans": spans[start : start + 40],
                            }
                        ],
                    }
                ]
            }
            out.write(json.dumps(request) + "\n")


def test_an_otel_history_is_learned_from_gated_and_published(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    suite = [
        {"id": f"s{i}", "input": f"which code for case {i}?", "reference": RIGHT}
        for i in range(300, 312)  # cases the history never asks about
    ]
    (tmp_path / "suite.jsonl").write_text("\n".join(json.dumps(item) for item in suite))
    history = tmp_path / "traces.jsonl"
    write_otel_history(history)
    with tiny_gateway(
        tmp_path, scenarios={"codes": {"upstream": "engine", "recipe": tmp_path / "recipe.yaml"}}
    ) as gateway:
        assert list(gateway.store.iter_export("codes")) == []  # no traffic before the import
        summary = ImportSummary()
        options = ImportOptions(scenario="codes", fmt="auto", checkpoint_dir=tmp_path / "imports")
        import_file(gateway.store, history, options, summary)
        assert (summary.records, summary.feedback, summary.skipped) == (
            CONVERSATIONS,
            CONVERSATIONS,
            0,
        ), summary.as_dict()
        assert summary.sessions == CONVERSATIONS
        imported = list(gateway.store.iter_export("codes"))
        assert {r.tags[ORIGIN_TAG] for r in imported} == {"import:otel"}
        assert all(r.release_id is None for r in imported)
        assert {f.correction for r in imported for f in r.feedback} == {RIGHT}

        settings = gateway.settings
        chain = ReleaseChain(gateway.database)
        artifacts = open_artifact_store(settings.artifacts_url())
        worker = Worker(
            settings.model_copy(update={"evaluation": EvaluationConfig(gateway_url=gateway.url)}),
            gateway.store,
            chain,
            artifacts,
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        )
        base = chain.head("codes")
        assert base is not None

        assert call(gateway.port, "POST", "/reef/scenarios/codes/learn", {}).status == 202
        [job] = worker.run_once()
        assert job.state == "succeeded", job.as_dict()
        assert job.result is not None
        assert job.result["gate"]["action"] == "published", job.result["gate"]
        head = chain.head("codes")
        assert head is not None and head.parent_id == base.id
        assert head.manifest.model.adapter is not None
        decision = (head.evidence or {})["gate"]["decision"]
        assert decision["overall"]["candidate_mean"] > decision["overall"]["baseline_mean"]
        consumed = set(JobQueue(gateway.database).consumed_by(job.id))
        assert consumed and consumed <= {r.id for r in imported}

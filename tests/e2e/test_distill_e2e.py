"""Distillation end to end on the tiny engine (docs/distillation.md): the teacher is a
loopback OpenAI-compatible server that labels each ticket right, the student the tiny
model. Traffic flows with no feedback at all and the teacher answers it; ``distill``
trains the student on those answers; the gate passes it on non-inferiority; the canary
rolls it out through every rollout step, still with nobody's feedback (the worker asks
the teacher about the student's answers: live teacher checks); then most held-out
requests are the student's, as accurate as the teacher's within the margin; and a
rollback release brings every request back to the teacher without a failed one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.config import EvaluationConfig
from reef.evaluation import EvaluationStore
from reef.jobs import JobQueue
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.fakes.teacher import TeacherThread
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

LABELS = {"squid": "Squid-7", "octopus": "Octo-3"}
MARGIN = 0.1
STEPS = [0.5, 1.0]
MAX_TOKENS = 10
RECIPE = f"""\
schema_version: 1
trigger: {{type: manual}}
selection: {{holdout_fraction: 0.25, require_feedback: false}}
learners:
  - type: distill
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    steps: 120
    threads: 1
    batch_size: 8
    seed: 0
gate:
  non_inferiority_margin: {MARGIN}
  holdout_teacher_references: true
  scorer: {{type: contains}}
  method: bootstrap  # one look on the holdout's ~16 items
  min_items: 8
  max_tokens: {MAX_TOKENS}
  concurrency: 4
  canary: {{fraction: 0.5, min_requests: 6}}
publish: canary
"""


def prompt(animal: str, case: int) -> str:
    return f"which code for the {animal} case {case}?"


def prompts(cases: range) -> Iterator[tuple[str, str]]:
    """(prompt, right label) for both animals of each case."""
    for case in cases:
        for animal, label in LABELS.items():
            yield prompt(animal, case), label


def ask(gateway: GatewayThread, text: str, **headers: str) -> tuple[str, dict[str, str]]:
    """The answer to ``text`` through the gateway and the response's headers (the SDK
    raises on any failed request)."""
    client = gateway.openai(**{"x-reef-scenario": "codes", **headers})
    raw = client.chat.completions.with_raw_response.create(
        model="reef/codes",
        messages=[{"role": "user", "content": text}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    return raw.parse().choices[0].message.content or "", dict(raw.headers)


def live_round(gateway: GatewayThread, cases: range) -> None:
    """Live traffic during the rollout, with no feedback either: the canary is decided
    on the worker's live teacher checks (``distill.live_references``)."""
    for text, _label in prompts(cases):
        ask(gateway, text)


def until_served(gateway: GatewayThread, release_id: str, cases: range) -> None:
    """Ask until an answer comes from ``release_id`` (the gateway activates a new head
    on its next poll of the chain); every request on the way must succeed."""
    for text, _label in prompts(cases):
        _answer, headers = ask(gateway, text)
        if headers["x-reef-release-id"] == release_id:
            return
    raise AssertionError(f"the gateway never served release {release_id}")


def test_a_student_distilled_without_feedback_takes_over_and_rolls_back(
    tmp_path: Path,
) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    scenario = {
        "upstream": "engine",
        "recipe": tmp_path / "recipe.yaml",
        "distill": {
            "teacher": {"upstream": "teacher", "model": "frontier"},
            "rollout_steps": STEPS,
        },
    }
    with TeacherThread(LABELS) as teacher:
        upstreams = {"teacher": {"type": "openai", "base_url": teacher.base_url}}
        with tiny_gateway(tmp_path, {"codes": scenario}, upstreams=upstreams) as gateway:
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
            first = chain.head("codes")
            assert first is not None and first.manifest.routing is not None
            assert first.manifest.routing.student_share == 0.0

            # traffic with no feedback at all: the teacher answers every request
            for text, label in prompts(range(40)):
                answer, headers = ask(gateway, text)
                assert headers["x-reef-served-by"] == "teacher" and answer == label
            assert teacher.calls == 80

            # distill -> the gate passes the student on non-inferiority -> a canary
            assert call(gateway.port, "POST", "/reef/scenarios/codes/learn", {}).status == 202
            [job] = worker.run_once()
            assert job.state == "succeeded", job.as_dict()
            assert job.result is not None
            gate = job.result["gate"]
            assert gate["action"] == "canary", gate
            candidate = chain.get_candidate(job.result["candidate_id"])
            decision = (candidate.evidence or {})["gate"]["decision"]
            assert decision["rule"]["non_inferiority_margin"] == MARGIN
            # no gain asked: the interval's lower end above -margin admits it
            assert decision["overall"]["difference"]["low"] > -MARGIN, decision["overall"]
            assert candidate.manifest.model.adapter is not None
            assert candidate.manifest.routing is not None
            assert candidate.manifest.routing.student_share == STEPS[0]

            # the rollout, still without feedback: the teacher checks the student's
            # answers, and those checks decide each step's canary in turn
            shares = []
            calls = teacher.calls
            for start in range(40, 80, 8):  # cases the training traffic never asked about
                live_round(gateway, range(start, start + 8))
                checked = worker.check_teachers()["codes"]
                assert checked.error is None and checked.waiting == 0, checked
                for outcome in worker.check_canaries():
                    assert outcome.action != "abandoned", outcome
                    if outcome.action == "promoted":
                        head = chain.head("codes")
                        assert head is not None and head.manifest.routing is not None
                        shares.append(head.manifest.routing.student_share)
                if shares and shares[-1] == STEPS[-1]:
                    break
            assert shares == STEPS
            assert chain.canaries() == {}
            assert teacher.calls > calls  # the checks asked the teacher
            no_feedback = [r for r in gateway.store.iter_export("codes") if r.feedback]
            assert all(fb.source == "judge:teacher" for r in no_feedback for fb in r.feedback), (
                "only the teacher's checks were written"
            )
            served = chain.head("codes")
            assert served is not None
            until_served(gateway, served.id, range(1000, 1100))

            # held-out requests on the served release: mostly the student, as accurate
            held_out = list(prompts(range(80, 100)))
            by_student = right = teacher_right = 0
            for text, label in held_out:
                answer, headers = ask(gateway, text)
                assert headers["x-reef-release-id"] == served.id
                by_student += headers["x-reef-served-by"] == "student"
                right += label in answer
                reference, headers = ask(gateway, text, **{"x-reef-escalate": "teacher"})
                assert headers["x-reef-served-by"] == "teacher"
                teacher_right += label in reference
            assert by_student >= 0.8 * len(held_out), by_student
            assert right / len(held_out) >= teacher_right / len(held_out) - MARGIN, right

            # a rollback release: every request back to the teacher, none failed
            body = {"to": first.id, "expected_head": served.id, "reason": "back to teacher"}
            reply = call(gateway.port, "POST", "/reef/scenarios/codes/rollback", body)
            assert reply.status in (200, 201), reply
            rollback = chain.head("codes")
            assert rollback is not None and rollback.operation == "rollback"
            until_served(gateway, rollback.id, range(2000, 2100))
            for text, label in held_out:
                answer, headers = ask(gateway, text)
                assert headers["x-reef-release-id"] == rollback.id
                assert headers["x-reef-served-by"] == "teacher" and answer == label

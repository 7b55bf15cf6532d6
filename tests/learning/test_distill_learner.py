"""The ``distill`` learner on tiny-random: the teacher's recorded answers are the targets
(at share 0 every record is the teacher's; later, the records that say so), negative
feedback drops one, a correction replaces one, the student's own answers are targets
only when corrected (on-policy); the candidate serves the trained adapter at the first
rollout share."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from reef.core.digests import tree_digest
from reef.core.errors import InvalidInputError
from reef.learning.base import (
    ExperienceBatch,
    LearnerContext,
    LearnerOutput,
    MetricLog,
    TrainingExample,
)
from reef.learning.learners.distill import DistillLearner, DistillLearnerConfig, candidate_share
from reef.learning.teacher import ReleaseManifests
from reef.learning.worker import _with_output
from reef.releases import (
    ArtifactStore,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    RoutingComponent,
    TeacherEndpoint,
    open_artifact_store,
)
from tests.fakes.learning import RecordedProgress, ScriptedReflector

TINY = "tiny-random"
TEACHER = TeacherEndpoint(upstream="frontier", model="big-1")

# PEFT 0.21 reads a deprecated transformers property while the engine wraps its model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)


def example(
    record_id: str, release_id: str, score: float | None = None, **extra: Any
) -> TrainingExample:
    return TrainingExample(
        record_id=record_id,
        scenario="s",
        session_id=record_id,
        messages=[{"role": "user", "content": f"Capital of {record_id}?"}],
        response={"role": "assistant", "content": f"teacher says {record_id}"},
        score=score,
        correction=None,
        feedback=[],
        principals=[],
        release_id=release_id,
        staleness=0,
        content_hash=record_id,
        **extra,
    )


@pytest.fixture
def chain(tmp_path: Path) -> Any:
    opened = ReleaseChain.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    yield opened
    opened.close()


def release(chain: ReleaseChain, share: float | None) -> Release:
    """A release of its own scenario (``create`` is idempotent per scenario)."""
    routing = None if share is None else RoutingComponent(student_share=share, teacher=TEACHER)
    manifest = ReleaseManifest(model=ModelComponent(base=TINY), routing=routing)
    scenario = f"s{len(chain.scenarios())}"
    return chain.create(scenario, manifest, actor="test", reason="test")


def context(
    tmp_path: Path, chain: ReleaseChain, head: Release, train: list[TrainingExample]
) -> LearnerContext:
    store: ArtifactStore = open_artifact_store(tmp_path / "artifacts")
    return LearnerContext(
        scenario="s",
        head=head,
        batch=ExperienceBatch(train=train, holdout=[]),
        artifacts=store,
        home=tmp_path / "home",
        work_dir=tmp_path / "work",
        reflector=ScriptedReflector(),
        progress=RecordedProgress(),
        metrics=MetricLog(),
        release_manifest=ReleaseManifests(chain),
    )


def traffic(before: Release, teacher_only: Release, routed: Release) -> list[TrainingExample]:
    """Records of three releases: one before distillation (no routing), the teacher
    serving everything (share 0), and one routing a share to the student."""
    tool_call = {"id": "c1", "name": "lookup", "arguments": '{"city": "Oslo"}'}
    return [
        example("plain", before.id),
        example("paris", teacher_only.id),
        example("rome", teacher_only.id, score=1.0),
        example("wrong", teacher_only.id, score=0.0),
        dataclasses.replace(example("fixed", teacher_only.id, score=0.0), correction="Bern"),
        dataclasses.replace(
            example("tools", teacher_only.id),
            tools=({"type": "function", "function": {"name": "lookup", "parameters": {}}},),
            response={"role": "assistant", "content": "", "tool_calls": [tool_call]},
        ),
        example("escalated", routed.id, served_by="teacher"),
        example("student", routed.id, served_by="student"),
        # a student answer the teacher's live check corrected: on-policy data
        dataclasses.replace(
            example("checked", routed.id, score=0.0, served_by="student"), correction="Oslo"
        ),
    ]


def test_targets_are_the_teachers_answers_kept_by_feedback(
    tmp_path: Path, chain: ReleaseChain
) -> None:
    before, teacher_only, routed = release(chain, None), release(chain, 0.0), release(chain, 0.5)
    ctx = context(tmp_path, chain, routed, traffic(before, teacher_only, routed))
    found = DistillLearner(DistillLearnerConfig()).training_set(ctx, ctx.batch.train)

    # In training order (``training_key``), not the batch's.
    assert sorted(found.used) == sorted(["paris", "rome", "fixed", "tools", "escalated", "checked"])
    targets = dict(zip(found.used, (e.target for e in found.examples), strict=True))
    assert targets["paris"] == "teacher says paris"
    assert targets["fixed"] == "Bern"  # the correction replaces the teacher's answer
    assert targets["checked"] == "Oslo"  # the student's own prompt, the corrected answer
    assert "<tool_call>" in targets["tools"] and '"Oslo"' in targets["tools"]
    assert isinstance(ctx.metrics, MetricLog)
    assert ctx.metrics.values["skipped_not_teacher"] == 2.0  # "plain" and "student"
    assert ctx.metrics.values["skipped_negative_feedback"] == 1.0  # "wrong"
    assert ctx.metrics.values["on_policy_examples"] == 1.0  # "checked"


def test_the_candidate_serves_the_student_adapter_at_the_first_share(
    tmp_path: Path, chain: ReleaseChain
) -> None:
    before, head = release(chain, None), release(chain, 0.0)  # the head: all the teacher's
    ctx = context(tmp_path, chain, head, traffic(before, head, release(chain, 0.5)))
    learner = DistillLearner(DistillLearnerConfig(steps=3, batch_size=2, threads=1, seed=7))
    output = learner.learn(ctx)

    assert output.adapter is not None
    assert sorted(output.consumed) == sorted(
        ["paris", "rome", "fixed", "tools", "escalated", "checked"]
    )
    assert output.routing == RoutingComponent(student_share=0.1, teacher=TEACHER)
    assert len(output.metrics["loss_curve"]) == 3
    assert tree_digest(ctx.artifacts.materialize(output.adapter)) == output.adapter
    manifest = _with_output(head.manifest, output, "distill")
    assert manifest.model == ModelComponent(base=TINY, adapter=output.adapter)
    assert manifest.routing is not None and manifest.routing.student_share == 0.1

    # Seeded: the same data and settings train the same adapter. The share follows the
    # scenario's first rollout step when the learner names none.
    ctx.work_dir, ctx.first_rollout_share = tmp_path / "again", 0.25
    again = learner.learn(ctx)
    assert again.adapter == output.adapter
    assert again.routing is not None and again.routing.student_share == 0.25


def test_the_learners_share_wins_over_the_scenarios_rollout(
    tmp_path: Path, chain: ReleaseChain
) -> None:
    head = release(chain, 0.0)
    ctx = context(tmp_path, chain, head, [])
    assert candidate_share(DistillLearnerConfig(), ctx) == 0.1
    ctx.first_rollout_share = 0.2
    assert candidate_share(DistillLearnerConfig(), ctx) == 0.2
    assert candidate_share(DistillLearnerConfig(student_share=0.5), ctx) == 0.5


def test_another_learner_keeps_the_routing(tmp_path: Path, chain: ReleaseChain) -> None:
    head = release(chain, 0.3)
    digest = "sha256:" + "a" * 64
    manifest = _with_output(head.manifest, LearnerOutput(harness=digest), "fewshot")
    assert manifest.routing == head.manifest.routing and manifest.harness == digest


def test_a_scenario_without_a_teacher_is_an_error(tmp_path: Path, chain: ReleaseChain) -> None:
    head = release(chain, None)
    ctx = context(tmp_path, chain, head, [example("plain", head.id)])
    with pytest.raises(InvalidInputError, match="no routing"):
        DistillLearner(DistillLearnerConfig()).learn(ctx)


def test_nothing_the_teacher_said_trains_nothing(tmp_path: Path, chain: ReleaseChain) -> None:
    head = release(chain, 0.5)
    ctx = context(tmp_path, chain, head, [example("mine", head.id, served_by="student")])
    output = DistillLearner(DistillLearnerConfig()).learn(ctx)
    assert output.adapter is None and output.routing is None and output.consumed == []


def char_logprobs(text: str) -> tuple[dict[str, Any], ...]:
    """``text``'s token logprobs as a teacher would send them, one token per character
    (each one tiny-random token), its top two: the character, then ``x``."""
    return tuple(
        {
            "token": c,
            "logprob": -0.1,
            "top_logprobs": [{"token": c, "logprob": -0.1}, {"token": "x", "logprob": -2.4}],
        }
        for c in text
    )


def logit_traffic(head: Release) -> list[TrainingExample]:
    """Teacher answers with their logprobs (``oslo``'s first two tokens are words, no
    tiny-random token: skipped), one without, and one a correction replaced."""
    words = ({"token": "teacher", "logprob": -0.2}, {"token": " says", "logprob": -0.3})
    return [
        dataclasses.replace(
            example(name, head.id), token_logprobs=char_logprobs(f"teacher says {name}")
        )
        for name in ("paris", "rome")
    ] + [
        dataclasses.replace(
            example("oslo", head.id), token_logprobs=words + char_logprobs(" oslo")
        ),
        example("bern", head.id),
        dataclasses.replace(
            example("fixed", head.id, score=0.0),
            correction="Bern",
            token_logprobs=char_logprobs("teacher says fixed"),
        ),
    ]


def test_logit_distillation_trains_on_the_teachers_logprobs_and_counts_what_aligned(
    tmp_path: Path, chain: ReleaseChain
) -> None:
    head = release(chain, 0.0)
    ctx = context(tmp_path, chain, head, logit_traffic(head))
    plain = DistillLearner(DistillLearnerConfig()).training_set(ctx, ctx.batch.train)
    assert all(not e.teacher_tokens for e in plain.examples)  # off by default
    settings = DistillLearnerConfig(
        steps=6, batch_size=5, threads=1, seed=7, logit_weight=0.5, logit_temperature=2.0
    )
    learner = DistillLearner(settings)
    found = learner.training_set(ctx, ctx.batch.train)
    assert found.used == plain.used  # the same training order as without logprobs
    carried = {u: len(e.teacher_tokens) for u, e in zip(found.used, found.examples, strict=True)}
    assert carried == {"paris": 18, "rome": 17, "oslo": 7, "bern": 0, "fixed": 0}

    output = learner.learn(ctx)
    assert output.adapter is not None
    metrics = output.metrics
    assert metrics["teacher_positions_aligned"] == 18 + 17 + 5
    assert metrics["teacher_positions_skipped"] == 2
    kl = metrics["logit_kl_curve"]
    assert len(kl) == len(metrics["loss_curve"]) == 6
    assert kl[-1] < kl[0]  # the student moves towards the teacher's distribution

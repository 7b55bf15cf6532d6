"""``distill``: a LoRA adapter for the student, trained on the teacher's recorded answers.

A distilled scenario's release routes between a student (the manifest's model) and a
teacher (``routing.teacher``); it starts at ``student_share: 0``, the teacher answering
everything and Reef recording it. Reads top to bottom:

1. The data: the batch's records the teacher answered (``reef.learning.teacher``: its
   record says so, or its release gave the student no share), chat, tool calls and
   merged multi-turn sessions alike. Feedback filters them: a correction replaces the
   teacher's answer, negative feedback (a score below ``drop_below``) drops it, none
   keeps it. A record the student answered is a target only through a correction
   (on-policy data: what the student said on real traffic, corrected), e.g. the
   teacher's answer that a live teacher check found different
   (``reef.learning.live_references``); otherwise never.
2. The training: exactly ``sft``'s (the same trainer, masking rule, budgets,
   ``render_harness``, replay and skew probe; ``reef.learning.learners.sft``). With
   ``logit_weight`` above 0, a teacher answer recorded with its top-k token logprobs
   (``scenarios.<s>.distill.teacher_logprobs``) also trains the student's distribution
   towards the teacher's at each of its tokens that aligns with the student's
   (``reef.learning.trainers.logit_distill``); the job reports how many aligned.
3. The candidate: the serving release's manifest with the trained adapter on the
   student's model, and its routing with ``student_share`` set to the first rollout
   step (the learner's ``student_share``, else the scenario's first rollout step, else
   0.1), for the gate's non-inferiority rule
   (``gate.non_inferiority_margin``) to admit.

The recipe reads records without feedback too (``selection.require_feedback: false``):
a distilled scenario's traffic usually has none (docs/distillation.md).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, cast

from pydantic import Field

from reef.core.errors import InvalidInputError
from reef.learning.base import LearnerConfig, LearnerContext, LearnerOutput, TrainingExample
from reef.learning.learners._examples import uses_tools
from reef.learning.learners._served import served_harness
from reef.learning.learners.sft import (
    SFTConfig,
    SFTLearner,
    TrainingSet,
    supervised_example,
    training_order,
    with_harness,
)
from reef.learning.teacher import NEGATIVE_BELOW, answered_by_teacher, teacher_reference
from reef.learning.trainers import SFTExample
from reef.learning.trainers.spec import teacher_tokens

# The candidate's share when neither the learner nor the scenario's rollout says.
DEFAULT_STUDENT_SHARE = 0.1


class DistillLearnerConfig(SFTConfig):
    """Settings of the ``distill`` learner: ``sft``'s (``min_score`` aside: unscored
    teacher answers are targets), plus ``student_share``, the candidate's first share
    of the traffic (default: the first of the scenario's ``distill.rollout_steps``,
    else ``DEFAULT_STUDENT_SHARE``), and ``drop_below``: a teacher answer whose
    mean feedback score is below this is dropped (negative feedback).
    ``logit_weight``: above 0, the loss adds that times the KL from the teacher's top-k
    distribution to the student's at the aligned tokens of answers recorded with the
    teacher's logprobs, both at ``logit_temperature`` (0: plain SFT;
    docs/distillation.md#logit-distillation). ``demos`` defaults to ``keep`` here: the
    release's harness prompts the teacher as well as the student, and dropping its demos
    would change the prompt of the model the student learns from."""

    demos: Literal["drop", "keep"] = "keep"
    student_share: float | None = Field(default=None, gt=0.0, le=1.0)
    drop_below: float = NEGATIVE_BELOW
    logit_weight: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    logit_temperature: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)

    def run_settings(self) -> dict[str, Any]:
        """``sft``'s, plus the logit-distillation term when it is on."""
        settings = super().run_settings()
        if self.logit_weight > 0:
            settings.update(
                logit_weight=self.logit_weight, logit_temperature=self.logit_temperature
            )
        return settings


def teacher_examples(
    context: LearnerContext, items: list[TrainingExample], drop_below: float
) -> tuple[list[TrainingExample], dict[str, int]]:
    """The items of ``items`` the teacher answered and feedback keeps, and the student's
    answers that feedback corrected, each with what it teaches as its correction
    (``teacher_reference``), and counts of what was left out (``not_teacher``,
    ``negative_feedback``, ``empty``) and of the corrected student answers kept
    (``on_policy``)."""
    kept: list[TrainingExample] = []
    skipped = {"not_teacher": 0, "negative_feedback": 0, "empty": 0, "on_policy": 0}
    for item in items:
        manifest = None if item.release_id is None else context.release_manifest(item.release_id)
        if not answered_by_teacher(item, manifest):
            if item.correction is not None:  # on-policy: the student's answer, corrected
                kept.append(item)
                skipped["on_policy"] += 1
            else:
                skipped["not_teacher"] += 1
            continue
        reference = teacher_reference(item, drop_below)
        if reference is None:
            negative = item.correction is None and item.score is not None
            skipped["negative_feedback" if negative else "empty"] += 1
            continue
        kept.append(item)
    return kept, skipped


def with_teacher_tokens(example: SFTExample, item: TrainingExample) -> SFTExample:
    """``example`` with the teacher's token logprobs of ``item``'s answer, when it has
    them and the example's target is that answer as text (no correction replaced it, no
    tool calls); else unchanged."""
    if not item.token_logprobs or item.correction is not None or uses_tools(item):
        return example
    tokens = teacher_tokens(item.token_logprobs)
    return example.model_copy(update={"teacher_tokens": tokens}) if tokens else example


def candidate_share(settings: DistillLearnerConfig, context: LearnerContext) -> float:
    """The student's share in the candidate: the learner's ``student_share``, else the
    scenario's first rollout step, else ``DEFAULT_STUDENT_SHARE``."""
    if settings.student_share is not None:
        return settings.student_share
    if context.first_rollout_share is not None:
        return context.first_rollout_share
    return DEFAULT_STUDENT_SHARE


class DistillLearner(SFTLearner):
    """Distillation of the teacher into the student (see the module docstring)."""

    type_name: ClassVar[str] = "distill"
    config_model: ClassVar[type[LearnerConfig]] = DistillLearnerConfig
    nothing_to_train: ClassVar[str] = "no teacher answers kept by feedback"

    @property
    def distill_settings(self) -> DistillLearnerConfig:
        """The settings, typed as this learner's."""
        return cast(DistillLearnerConfig, self.config)

    def training_set(self, context: LearnerContext, items: list[TrainingExample]) -> TrainingSet:
        """The teacher's answers among ``items`` kept by feedback, the correction as the
        target where there is one, as the candidate will serve them."""
        kept, skipped = teacher_examples(context, items, self.distill_settings.drop_below)
        found = []
        logits = self.distill_settings.logit_weight > 0
        for item in kept:
            example = supervised_example(item, reply_is_target=True)
            if example is not None:
                if logits:
                    example = with_teacher_tokens(example, item)
                found.append((example, item.record_id))
        prompts, used = training_order(found)
        if items is context.batch.train:
            for reason, count in skipped.items():
                name = "on_policy_examples" if reason == "on_policy" else f"skipped_{reason}"
                context.metrics.record(name, float(count))
        harness = served_harness(context, self.settings)
        return TrainingSet(with_harness(prompts, harness), prompts, used)

    def learn(self, context: LearnerContext) -> LearnerOutput:
        """``sft`` on the teacher's answers, and the candidate's routing: the serving
        release's with ``student_share``. Raises ``InvalidInputError`` when the serving
        release routes nothing to a teacher (the scenario is not distilled)."""
        routing = context.head.manifest.routing
        if routing is None:
            raise InvalidInputError(
                f"distill: the serving release of scenario {context.scenario!r} has no "
                "routing (no teacher to learn from); configure the scenario's distill "
                "section so its releases route to a teacher"
            )
        output = super().learn(context)
        if output.adapter is None:
            return output
        share = candidate_share(self.distill_settings, context)
        return LearnerOutput(
            adapter=output.adapter,
            harness=output.harness,
            consumed=output.consumed,
            metrics={**output.metrics, "student_share": share},
            probe=output.probe,
            routing=routing.model_copy(update={"student_share": share}),
        )

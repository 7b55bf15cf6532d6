"""The ``scenarios.<s>.distill`` section: the teacher of a distilled scenario, the
escalation rules its releases start with, and the rollout steps (docs/distillation.md).

The section only configures; the release chain decides what serves. A distilled
scenario's first release carries ``routing`` with ``student_share`` 0 (the teacher
answers everything and Reef records it): ``reef.gateway.serving.drift.initial_routing``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reef.core.routing import EscalationRules, TeacherEndpoint

if TYPE_CHECKING:
    from reef.config.models import ReefSettings


class LiveReferencesConfig(BaseModel):
    """Live evidence from the teacher while a student release is a canary
    (``reef.learning.live_references``): the learning worker asks the teacher the
    requests the student answered among the checked records and scores the student's
    answer against the teacher's with the gate's scorer, so the rollout decides without
    anyone's feedback."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fraction: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Share of a routed canary's records (both arms) that count as "
        "evidence; each one the student answered costs one teacher call. 0: off (the "
        "canary then decides on feedback).",
    )
    on_policy_fraction: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Outside a canary: share of the serving student's answers the teacher "
        "checks; a corrected one is on-policy data for the next distill job (0: none).",
    )
    calls_per_pass: int = Field(
        default=32, ge=1, description="Most teacher calls one worker pass makes."
    )
    max_calls_per_hour: int = Field(
        default=600, ge=1, description="Most teacher calls per hour for this scenario."
    )
    max_tokens: int = Field(
        default=1024, ge=1, description="Cap on the teacher's answer when the request sets none."
    )


class DistillConfig(BaseModel):
    """A scenario served by a student model that learns from a teacher model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    teacher: TeacherEndpoint = Field(
        description="The teacher: a configured upstream (`upstreams.<u>`) and the model "
        "name it answers as."
    )
    escalation: EscalationRules = Field(
        default_factory=EscalationRules,
        description="When the student's answer is replaced by the teacher's; copied into "
        "the scenario's first release (`routing.escalation`).",
    )
    rollout_steps: list[float] = Field(
        default_factory=lambda: [0.1, 0.5, 1.0],
        description="The student shares a passed student release goes through, one canary "
        "step each: increasing, each in (0, 1].",
    )

    teacher_logprobs: int = Field(
        default=0,
        ge=0,
        le=20,
        description="Logit distillation: ask the teacher for this many `top_logprobs` per "
        "token on the non-streaming OpenAI chat requests it answers (0: off; at most 20, "
        "OpenAI's bound). They are kept in the record for the `distill` learner's "
        "`logit_weight` and left out of the client's answer unless it asked for logprobs "
        "(docs/distillation.md#logit-distillation).",
    )
    live_references: LiveReferencesConfig = Field(
        default_factory=LiveReferencesConfig,
        description="Live evidence from the teacher while a student release is a canary.",
    )

    @field_validator("rollout_steps")
    @classmethod
    def _steps_increase(cls, steps: list[float]) -> list[float]:
        if not steps:
            raise ValueError("rollout_steps must name at least one share, e.g. [0.1, 0.5, 1.0]")
        previous = 0.0
        for step in steps:
            if not 0.0 < step <= 1.0 or step <= previous:
                raise ValueError(
                    f"rollout_steps must increase, each in (0, 1], got {steps}: "
                    f"{step} is not above {previous} or is outside (0, 1]"
                )
            previous = step
        return steps


def check_distill(settings: ReefSettings) -> None:
    """``ValueError`` naming the field for a teacher upstream that is not configured."""
    for name, scenario in settings.scenarios.items():
        distill = scenario.distill
        if distill is not None and distill.teacher.upstream not in settings.upstreams:
            raise ValueError(
                f"scenarios.{name}.distill.teacher.upstream: upstream "
                f"{distill.teacher.upstream!r} is not configured; configured upstreams: "
                f"{sorted(settings.upstreams)}"
            )

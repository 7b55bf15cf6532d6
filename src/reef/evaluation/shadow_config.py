"""The shadow arm's settings: ``gate.shadow`` of a recipe (``reef.evaluation.shadow``).

```yaml
gate:
  shadow:
    fraction: 0.2          # share of the scenario's live requests also sent to the candidate
    max_requests: 200      # shadow calls per candidate, at most
    max_tokens: 256        # reply cap of each shadow call
    concurrency: 2         # shadow calls in flight per gateway; more are dropped
    judge:                 # pairs without a reference are judged pairwise
      upstream: judge      # never one of the arms (refused at load)
      model: judge-model
      position_check: 0.2  # share of judged pairs judged in both orders
      max_position_flips: 0.2
```
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ShadowJudgeConfig(_Strict):
    """The pairwise judge of shadow pairs that have no reference. It sees the
    conversation and the two answers in random order, unlabelled
    (``reef.evaluation.judging``); it must be neither arm's model."""

    upstream: str | None = Field(
        default=None,
        description="The judge's upstream (default: the scenario's own, with another model).",
    )
    model: str | None = Field(
        default=None, description="The judge's model (required: never the arms' model)."
    )
    position_check: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="Share of judged pairs judged again in the other order, to measure "
        "position bias.",
    )
    max_position_flips: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="A judge whose verdict follows the order on more than this share of "
        "the pairs judged both ways is flagged and its verdicts do not count.",
    )
    max_tokens: int = Field(default=256, ge=1, description="Reply cap of a judge call.")
    seed: int = Field(default=0, description="Seed of the answer order and the checked sample.")

    @model_validator(mode="after")
    def _not_an_arm(self) -> ShadowJudgeConfig:
        if self.model is None:
            raise ValueError(
                "shadow.judge.model is required: without it the judge is the scenario's "
                "own model, which is one of the arms it would judge"
            )
        return self


class ShadowConfig(_Strict):
    """Shadow traffic (``gate.shadow``): while a candidate is ``evaluating``, a sampled
    share of its scenario's live requests is also sent to it after the live answer went
    out, recorded with purpose ``shadow`` (never returned, never trained on); the pairs
    become the gate's ``shadow`` suite."""

    fraction: float = Field(
        default=0.1, gt=0.0, le=1.0, description="Share of live requests shadowed."
    )
    max_requests: int = Field(default=200, ge=1, description="Shadow calls per candidate.")
    max_tokens: int = Field(default=256, ge=1, description="Reply cap of each shadow call.")
    concurrency: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Shadow calls in flight per gateway; a request sampled beyond it is "
        "dropped, never queued.",
    )
    judge: ShadowJudgeConfig | None = Field(
        default=None,
        description="Pairwise judge for pairs whose live answer has no reference (none: "
        "only pairs with a reference count).",
    )

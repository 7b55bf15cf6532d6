"""Credit assignment: how the outcome of a session's task reaches its turns.

An outcome (feedback with a ``session_id``, ``POST /reef/feedback``) is about a branch of
the session's trajectory (``reef.experience.trajectories``): the branch up to the turn it
targets, else the branch that ended last. ``CreditConfig`` (a recipe's
``selection.credit``) says which assistant turns of that branch get its score:

- ``outcome``: every turn gets the score;
- ``last``: only the last turn does;
- ``discounted``: turn ``i`` of ``n`` gets ``score * factor ** (n - i)``, so later turns
  weigh more and the last gets the whole score.

``credited_feedback`` turns each outcome into per-turn feedback: a copy of the outcome
carrying the turn's share of the score, and the correction only on the turn it targets
(else the branch's last). Selection treats that copy like feedback given on the turn's
record, so every learner sees per-turn scores without knowing about sessions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from reef.experience import FeedbackView, RecordView, assemble_trajectory


class CreditConfig(BaseModel):
    """``selection.credit``: a policy name, or ``{policy, factor}`` (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["outcome", "last", "discounted"] = "outcome"
    factor: float = Field(
        default=0.9, gt=0.0, le=1.0, description="discounted only: each earlier turn's share"
    )

    @model_validator(mode="before")
    @classmethod
    def _named(cls, value: Any) -> Any:
        return {"policy": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _factor_needs_discounting(self) -> CreditConfig:
        if "factor" in self.model_fields_set and self.policy != "discounted":
            raise ValueError(f"factor applies to policy 'discounted' only, not {self.policy!r}")
        return self

    @model_serializer(mode="wrap")
    def _factor_only_when_discounted(
        self, handler: SerializerFunctionWrapHandler
    ) -> dict[str, Any]:
        # What it dumps parses again: a recipe carried in a job (reef learn --recipe) is
        # dumped and parsed back, and a factor beside another policy is refused.
        data: dict[str, Any] = handler(self)
        if self.policy != "discounted":
            data.pop("factor", None)
        return data


def turn_scores(
    count: int, score: float | None, config: CreditConfig
) -> list[tuple[int, float | None]]:
    """(index, share of ``score``) of each of ``count`` turns (oldest first) that the
    policy credits; an outcome without a score credits the same turns with none."""
    if count == 0:
        return []
    if config.policy == "last":
        return [(count - 1, score)]
    if config.policy == "discounted" and score is not None:
        return [(index, score * config.factor ** (count - 1 - index)) for index in range(count)]
    return [(index, score) for index in range(count)]


def credited_feedback(
    session_records: Sequence[RecordView],
    outcomes: Sequence[FeedbackView],
    config: CreditConfig,
) -> dict[str, list[FeedbackView]]:
    """Record id -> the per-turn feedback ``outcomes`` give it (module docstring).

    ``session_records`` are all of one session's records, in turn order (the trajectory
    is assembled from them); ``outcomes`` that session's outcomes to credit. An outcome
    whose targeted record is not among them credits nothing.
    """
    if not session_records or not outcomes:
        return {}
    first = session_records[0]
    trajectory = assemble_trajectory(first.scenario, first.session_id, session_records)
    status = {record.id: record.status for record in session_records}
    credited: dict[str, list[FeedbackView]] = {}
    for outcome in outcomes:
        target = outcome.record_ids[0] if outcome.record_ids else None
        if target is not None and target not in status:
            continue
        branch = trajectory.branch_through(target)
        turns = [record_id for record_id in branch.records if status[record_id] == "ok"]
        corrected = target or (turns[-1] if turns else None)
        for index, score in turn_scores(len(turns), outcome.score, config):
            record_id = turns[index]
            correction = outcome.correction if record_id == corrected else None
            share = dataclasses.replace(outcome, score=score, correction=correction)
            credited.setdefault(record_id, []).append(share)
    return credited

"""The train/serve skew check: does the candidate, as served, say what its trainer says
it learned?

A model can fit its training set and still fail as served when training saw a different
prompt than serving sends: most often a ``harness: managed`` scenario trained with
``render_harness: false``, whose records lack the system text and demos the gateway
renders in (``reef.learning.learners._served``); also a chat template, tokenizer or
precision that differs between the trainer and the server. Every unit test passes and
the gate only says "rejected"; this check says why, before the gate spends a call.

The ``sft`` and ``full`` trainers measure, after training, whether their greedy answer
to each of ``SKEW_SAMPLE`` of their own training prompts is the target
(``reef.learning.trainers.probe``; teacher-forced arg-max, which is what greedy decoding
gives, for one forward pass). Before the gate, the worker asks the candidate the same
prompts as the client sent them, through the gateway, pinned to the candidate, purpose
``eval`` (never trained on), at temperature 0 with room for the target's tokens; an
answer counts when its text, stripped, is the target's. When the trainer reached at
least ``MIN_TRAINED_ACCURACY`` and the served accuracy is more than ``MAX_GAP`` below
it, the job fails (not retried: the same data trains the same way) with a message that
starts ``train/serve skew:``, gives both figures and names ``render_harness``, and the
candidate is rejected. Both figures are recorded either way (the job's metrics
``trained_accuracy`` and ``served_accuracy``, and ``skew`` in its result). A retried job
that finds its candidate already proposed goes straight to the gate: the probe lived in
the attempt that trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reef.core.errors import InvalidInputError
from reef.evaluation import EvalItem, GatewayTarget, collect_answers
from reef.learning.base import ProbedPrompt

SKEW_SAMPLE = 8
"""Training prompts a model learner's trainer probes, and the candidate answers."""
MIN_TRAINED_ACCURACY = 0.8
"""Below this trained accuracy the trainer did not fit its sample: a low served figure
then says nothing about serving (the gate judges such a candidate)."""
MAX_GAP = 0.5
"""How far the served accuracy may fall below the trained one before the job fails."""
REPLY_SLACK_TOKENS = 16
"""Tokens allowed beyond the target's own, so a longer wrong answer is seen as wrong."""


class TrainServeSkewError(InvalidInputError):
    """The candidate as served answers its own training prompts far worse than its
    trainer measured (module docstring). An ``InvalidInputError``: the job is not
    retried."""


@dataclass(frozen=True)
class SkewReport:
    """Both figures on the same prompts: ``trained`` (the trainer's greedy accuracy),
    ``served`` (the candidate's through the gateway; None when no call was answered),
    ``prompts`` asked and ``errors`` (calls that got no answer, left out of ``served``)."""

    trained: float
    served: float | None
    prompts: int
    errors: int

    @property
    def skewed(self) -> bool:
        """Whether the served figure falls far below a trained figure that fits."""
        return (
            self.served is not None
            and self.trained >= MIN_TRAINED_ACCURACY
            and self.served < self.trained - MAX_GAP
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the job's result, the candidate's evidence)."""
        return {
            "trained_accuracy": self.trained,
            "served_accuracy": self.served,
            "prompts": self.prompts,
            "errors": self.errors,
            "skewed": self.skewed,
        }

    def message(self) -> str:
        """What the failed job says: both figures and the setting that most often
        causes the gap."""
        served = 0.0 if self.served is None else self.served
        return (
            f"train/serve skew: the trainer's greedy answers matched {self.trained:.0%} of "
            f"{self.prompts} of its training prompts, the candidate as served "
            f"{served:.0%} of the same prompts through the gateway. The model was trained "
            "on prompts unlike those it serves: for a `harness: managed` scenario, leave "
            "`render_harness` at its default (or set it true) so training renders the "
            "candidate's harness in, and list harness learners before model learners; "
            "otherwise check that trainer and server use the same model, chat template "
            "and precision"
        )


def probe_items(probe: Sequence[ProbedPrompt]) -> list[EvalItem]:
    """The probe's prompts as eval items: greedy, with room for the target's tokens."""
    return [
        EvalItem(
            id=str(index),
            suite="skew",
            messages=prompt.messages,
            reference=prompt.target,
            params={
                "temperature": 0.0,
                "max_tokens": prompt.target_tokens + REPLY_SLACK_TOKENS,
            },
        )
        for index, prompt in enumerate(probe)
    ]


def check_skew(
    target: GatewayTarget, candidate_id: str, probe: Sequence[ProbedPrompt]
) -> SkewReport:
    """Ask the candidate ``probe``'s prompts through the gateway (pinned, purpose
    ``eval``) and compare with what its trainer measured. Raises ``EvalRunError`` when
    the gateway refuses the pin. Call only with a non-empty ``probe``."""
    answers = collect_answers(target, probe_items(probe), {"candidate": candidate_id})
    answered = [(a, p) for a, p in zip(answers, probe, strict=True) if a.text is not None]
    trained = sum(p.trained for p in probe) / len(probe)
    served = None
    if answered:
        hits = sum((a.text or "").strip() == p.target.strip() for a, p in answered)
        served = hits / len(answered)
    return SkewReport(trained, served, len(probe), len(probe) - len(answered))

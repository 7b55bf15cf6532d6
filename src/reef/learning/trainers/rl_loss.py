"""The GRPO objective both RL trainers share (single replies, ``grpo``; episodes,
``episode_training``): TRL's ``GRPOTrainer._compute_loss`` (TRL 1.16, token-level importance
sampling) on Reef's flat token tensors. Imports torch: only the training child or a test
imports it.

Per trained token ``t`` of sequence ``s`` (a completion, or every sampled token of an
episode), with ``r_t = exp(logπ_t - logπ_old,t)`` against the log-probs of the policy
that sampled it:

- policy: ``-min(r_t * A_s, clip(r_t, 1 - epsilon, 1 + epsilon_high) * A_s)``, PPO's
  clipped surrogate (its gradient at ``r_t = 1`` is ``-A_s ∇logπ_t``);
- KL: ``beta * (exp(ref_t - logπ_t) - (ref_t - logπ_t) - 1)``, the k3 estimator;

summed with a weight per sequence that ``loss_type`` picks (``S`` sequences, ``n_s``
tokens in ``s``, ``N`` in all, ``L`` the completion length limit):

- ``dapo`` and ``bnpo``: ``1 / N`` (token mean over the step; identical in Reef, whose
  step is one batch without gradient accumulation);
- ``grpo``: ``1 / (S * n_s)`` (each sequence's token mean, then the mean);
- ``dr_grpo``: ``1 / (S * L)`` (Dr. GRPO's constant);
- ``sequence_sum``: ``1 / S`` (each sequence's token sum, then the mean: TRL's ``luspo``
  at token-level importance sampling, and Reef's loss before loss types).

The weights come from the whole step, so a step computed micro-batch by micro-batch sums
to the loss of one pass. Evidence: ``tests/learning/test_rl_loss.py`` (TRL's own
``_compute_loss`` per loss type, and ratios after two updates).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reef.learning.trainers.spec import GRPOLossType, RLSpec

EPS = 1e-4


def group_advantages(rewards: list[float]) -> list[float]:
    """``(r - mean) / (std + eps)`` within one group, the sample std (Bessel's
    correction) as TRL's ``scale_rewards: group``; a lone reward gets 0
    (``tests/learning/test_rl_loss.py::test_advantages_are_trl_s``)."""
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards)
    return [(r - mean) / (std + EPS) for r in rewards]


@dataclass(frozen=True)
class LossSettings:
    """The objective's settings (TRL's names: ``loss_type``, ``epsilon``,
    ``epsilon_high``, ``beta``, ``max_completion_length``)."""

    loss_type: GRPOLossType = "dapo"
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0
    max_completion_length: int = 64

    @classmethod
    def of(cls, spec: RLSpec) -> LossSettings:
        """A run's settings (``epsilon_high`` None: ``epsilon``)."""
        high = spec.epsilon if spec.epsilon_high is None else spec.epsilon_high
        return cls(spec.loss_type, spec.epsilon, high, spec.beta_kl, spec.max_new_tokens)


def sequence_weights(settings: LossSettings, lengths: torch.Tensor) -> torch.Tensor:
    """The weight of every token of each sequence, from the step's token counts per
    sequence (the module docstring)."""
    count = lengths.numel()
    lengths = lengths.to(torch.float32)
    if settings.loss_type in ("dapo", "bnpo"):
        return torch.full_like(lengths, 1.0 / max(float(lengths.sum()), 1.0))
    if settings.loss_type == "grpo":
        return 1.0 / (count * lengths.clamp(min=1.0))
    if settings.loss_type == "dr_grpo":
        return torch.full_like(lengths, 1.0 / (count * settings.max_completion_length))
    return torch.full_like(lengths, 1.0 / count)


@dataclass(frozen=True)
class LossParts:
    """One batch's share of the loss and its tallies: ``kl_sum`` (k3 summed over its
    tokens; 0 when ``beta`` is 0), ``tokens``, the tokens clipped below (ratio under
    ``1 - epsilon`` with a negative advantage) and above (over ``1 + epsilon_high``
    with a positive one), and the ratios' sum, min and max."""

    loss: torch.Tensor
    kl_sum: float
    tokens: int
    clipped_low: int
    clipped_high: int
    ratio_sum: float
    ratio_min: float
    ratio_max: float


def clipped_loss(
    settings: LossSettings,
    policy: torch.Tensor,
    old: torch.Tensor,
    reference: torch.Tensor | None,
    advantages: torch.Tensor,
    weights: torch.Tensor,
) -> LossParts:
    """The loss of a batch of tokens (the module docstring): ``policy``, ``old`` and
    ``reference`` (None when ``beta`` is 0) are flat per-token log-probs; ``advantages``
    and ``weights`` (``sequence_weights``) per token, taken from their sequences."""
    ratio = torch.exp(policy - old)
    clipped = torch.clamp(ratio, 1 - settings.epsilon, 1 + settings.epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    kl_sum = 0.0
    if settings.beta != 0.0:
        if reference is None:
            raise ValueError("a KL term (beta > 0) needs the reference log-probs")
        delta = reference - policy
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + settings.beta * kl
        kl_sum = float(kl.detach().sum())
    low = (ratio < 1 - settings.epsilon) & (advantages < 0)
    high = (ratio > 1 + settings.epsilon_high) & (advantages > 0)
    plain = ratio.detach()
    return LossParts(
        loss=(per_token * weights).sum(),
        kl_sum=kl_sum,
        tokens=policy.numel(),
        clipped_low=int(low.sum()),
        clipped_high=int(high.sum()),
        ratio_sum=float(plain.sum()),
        ratio_min=float(plain.min()) if plain.numel() else 1.0,
        ratio_max=float(plain.max()) if plain.numel() else 1.0,
    )


def old_logps(
    policy: torch.Tensor, parts: Sequence[tuple[int, Sequence[float] | None]]
) -> torch.Tensor:
    """The sampling policy's log-probs of ``policy``'s tokens (flat, part after part:
    each part its token count and the sampler's log-probs of them, or None): a part's
    recorded ones where the sampler reported one per token, else the trainer's own,
    detached (sampled by the policy before this update: the ratio is exactly 1)."""
    detached = policy.detach()
    pieces: list[torch.Tensor] = []
    start = 0
    for count, recorded in parts:
        if recorded is not None and len(recorded) == count:
            pieces.append(torch.tensor(list(recorded), dtype=policy.dtype, device=policy.device))
        else:
            pieces.append(detached[start : start + count])
        start += count
    if start != policy.numel():
        raise ValueError(f"{start} tokens in the parts, {policy.numel()} log-probs")
    return torch.cat(pieces) if pieces else detached


@dataclass
class StepTally:
    """A step's ``LossParts`` added up, micro-batch by micro-batch."""

    kl_sum: float = 0.0
    tokens: int = 0
    clipped_low: int = 0
    clipped_high: int = 0
    ratio_sum: float = 0.0
    ratio_min: float = float("inf")
    ratio_max: float = float("-inf")

    def add(self, parts: LossParts) -> None:
        self.kl_sum += parts.kl_sum
        self.tokens += parts.tokens
        self.clipped_low += parts.clipped_low
        self.clipped_high += parts.clipped_high
        self.ratio_sum += parts.ratio_sum
        self.ratio_min = min(self.ratio_min, parts.ratio_min)
        self.ratio_max = max(self.ratio_max, parts.ratio_max)


@dataclass
class RatioCurves:
    """The run's per-step curves of the objective: ``kl_curve`` (mean k3 per token;
    empty when ``beta`` is 0), ``clip_low_curve`` and ``clip_high_curve`` (the share of
    tokens clipped), ``ratio_curve`` (``[min, mean, max]`` of the importance ratios)."""

    kl: list[float]
    clip_low: list[float]
    clip_high: list[float]
    ratio: list[list[float]]

    @classmethod
    def empty(cls) -> RatioCurves:
        return cls([], [], [], [])

    def add(self, tally: StepTally, beta: float) -> None:
        tokens = max(tally.tokens, 1)
        if beta != 0.0:
            self.kl.append(round(tally.kl_sum / tokens, 6))
        self.clip_low.append(round(tally.clipped_low / tokens, 6))
        self.clip_high.append(round(tally.clipped_high / tokens, 6))
        if tally.tokens:
            mean = tally.ratio_sum / tokens
            self.ratio.append([round(v, 6) for v in (tally.ratio_min, mean, tally.ratio_max)])

    def metrics(self) -> dict[str, list[Any]]:
        return {
            "kl_curve": self.kl,
            "clip_low_curve": self.clip_low,
            "clip_high_curve": self.clip_high,
            "ratio_curve": self.ratio,
        }

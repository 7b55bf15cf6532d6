"""How long a trainer trains: budgets in terms of the data, not a fixed step count.

A ``Budget`` says how many passes over the training examples to make (``epochs``), with
``max_steps`` and ``max_seconds`` as caps (never the driver), or an exact ``steps`` count
for reproductions and tests. Before training, ``validation_fraction`` of the examples
(at least ``validation_min`` of them, and only when there are ``validation_from`` or more)
is held out *inside* the trainer — never the gate's holdout — and its loss is measured
every ``eval_every`` steps (default: twice per epoch). Training stops early when the
validation loss has not improved by ``min_delta`` (relative) plus ``min_delta_abs`` for
``patience`` evaluations, and the best weights seen are the ones kept. The learning rate warms up
linearly over ``warmup_fraction`` (default 0.05) of the planned steps, then decays
(``cosine``, the default, or ``linear``) to ``min_lr_fraction`` of its peak, or stays
``constant``; an exact ``steps`` count runs at a constant rate with no warmup unless
told otherwise, so recipes tuned on fixed runs reproduce them. ``fitted_loss`` (None: off;
an SFT learner's setting) stops a run whose mean training loss over its last
``fitted_window`` steps is at or below it, once every example was seen
(:func:`fitted`). ``known_loss`` (None: off) stops a run after its first pass when that
pass's mean training loss is at or below it: the run started out knowing its examples
(:func:`known`). ``deadline_seconds`` is
not the recipe's: it is what the learning budget's training minutes have left (the
worker sets it, ``reef.experience.learning_spend``), checked after every step like
``max_seconds``.

``stop_reason`` is one of ``completed`` (every planned epoch ran), ``early_stopped``
(validation loss stopped improving: converged), ``max_steps``, ``max_seconds``,
``steps`` (the exact count ran), ``fitted`` (the training loss sat at ``fitted_loss`` or
below: the examples are learned), ``known`` (the first pass's loss was at ``known_loss``
or below: the examples were known before the run) or ``learning_budget`` (the deadline
came: the run is half-made and its adapter is not proposed). ``undertrained`` is True
when a run ended with its validation loss still falling — more training would likely
have helped; None without a validation split.

Torch-free: the trainers apply these plans; the worker and tests read the reports.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

StopReason = Literal[
    "completed",
    "early_stopped",
    "max_steps",
    "max_seconds",
    "steps",
    "fitted",
    "known",
    "learning_budget",
]


class Budget(BaseModel):
    """A training budget (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: float = Field(default=5.0, gt=0.0, le=1000.0)
    steps: int | None = Field(default=None, ge=1)
    max_steps: int | None = Field(default=None, ge=1)
    max_seconds: float | None = Field(default=None, gt=0.0)
    deadline_seconds: float | None = Field(default=None, gt=0.0)
    validation_fraction: float = Field(default=0.1, ge=0.0, le=0.5)
    validation_min: int = Field(default=4, ge=1)
    validation_from: int = Field(default=20, ge=2)
    eval_every: int | None = Field(default=None, ge=1)
    patience: int = Field(default=3, ge=1)
    min_delta: float = Field(default=0.01, ge=0.0, lt=1.0)
    min_delta_abs: float = Field(default=0.001, ge=0.0)
    warmup_fraction: float | None = Field(default=None, ge=0.0, lt=1.0)
    schedule: Literal["cosine", "linear", "constant"] | None = None
    min_lr_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    fitted_loss: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    fitted_window: int = Field(default=8, ge=1)
    known_loss: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)

    @property
    def warmup(self) -> float:
        """The warmup share: as set, else 0.05 — or none for an exact ``steps`` count,
        which reproduces a fixed run at a constant rate."""
        if self.warmup_fraction is not None:
            return self.warmup_fraction
        return 0.0 if self.steps is not None and self.schedule is None else 0.05

    @property
    def decay(self) -> Literal["cosine", "linear", "constant"]:
        """The schedule after the warmup: as set, else cosine (constant for ``steps``)."""
        if self.schedule is not None:
            return self.schedule
        return "constant" if self.steps is not None else "cosine"


def split_validation(count: int, budget: Budget, rng: random.Random) -> tuple[list[int], list[int]]:
    """(training indices, validation indices) of ``count`` examples, drawn by ``rng``;
    no validation below ``validation_from`` examples or with ``validation_fraction`` 0
    (or in exact-``steps`` mode, which reproduces a fixed run)."""
    indices = list(range(count))
    if (
        budget.steps is not None
        or budget.validation_fraction == 0
        or count < budget.validation_from
    ):
        return indices, []
    size = max(budget.validation_min, round(count * budget.validation_fraction))
    rng.shuffle(indices)
    return sorted(indices[size:]), sorted(indices[:size])


def epoch_steps(train_count: int, batch_size: int) -> int:
    """Steps in one pass over ``train_count`` examples (a partial batch is a step)."""
    return -(-train_count // batch_size)


def planned_steps(train_count: int, batch_size: int, budget: Budget) -> int:
    """Optimizer steps the budget allows: ``steps``, else ``epochs`` passes (rounded up
    to whole batches), capped by ``max_steps``."""
    if budget.steps is not None:
        return budget.steps
    per_epoch = epoch_steps(train_count, batch_size)
    planned = max(1, math.ceil(per_epoch * budget.epochs))
    return min(planned, budget.max_steps) if budget.max_steps is not None else planned


def eval_interval(train_count: int, batch_size: int, budget: Budget) -> int:
    """Steps between validation passes: ``eval_every``, else half an epoch."""
    if budget.eval_every is not None:
        return budget.eval_every
    return max(1, epoch_steps(train_count, batch_size) // 2)


def lr_factor(step: int, total: int, budget: Budget) -> float:
    """The learning rate's multiplier at optimizer step ``step`` (0-based) of ``total``."""
    warmup = math.floor(budget.warmup * total)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if budget.decay == "constant" or total - warmup <= 1:
        return 1.0
    progress = (step - warmup) / (total - warmup - 1)
    floor = budget.min_lr_fraction
    if budget.decay == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def batch_plan(
    indices: list[int], batch_size: int, steps: int, rng: random.Random
) -> list[list[int]]:
    """The examples of every step: ``indices`` reshuffled each epoch, cycling as needed."""
    order: list[int] = []
    plan: list[list[int]] = []
    while len(plan) < steps:
        if not order:
            order = list(indices)
            rng.shuffle(order)
        plan.append(order[:batch_size])
        order = order[batch_size:]
    return plan


@dataclass
class EarlyStopping:
    """Tracks validation losses; ``update`` says whether this one is the best so far."""

    budget: Budget
    curve: list[tuple[int, float]] = field(default_factory=list)
    best: float = math.inf
    best_step: int = 0
    waited: int = 0
    # The best loss when patience was last reset: gains are measured against it.
    reference: float = math.inf

    def update(self, step: int, loss: float) -> bool:
        """Record ``loss`` at ``step``; True when it is the lowest so far (keep these
        weights). Only a gain of ``min_delta`` (relative) plus ``min_delta_abs`` over the
        last such gain resets the patience."""
        self.curve.append((step, round(loss, 6)))
        if loss < self._bar(self.reference):
            self.reference, self.waited = loss, 0
        else:
            self.waited += 1
        if loss < self.best:
            self.best, self.best_step = loss, step
            return True
        return False

    def _bar(self, best: float) -> float:
        """What a loss must be below to count as a gain over ``best``."""
        return best * (1.0 - self.budget.min_delta) - self.budget.min_delta_abs

    @property
    def should_stop(self) -> bool:
        """Patience is spent."""
        return self.waited >= self.budget.patience

    def still_falling(self) -> bool | None:
        """Whether the last evaluation was the best and improved on the one before it
        (None without evaluations)."""
        if not self.curve:
            return None
        if len(self.curve) < 2:
            return True
        last, before = self.curve[-1][1], min(loss for _, loss in self.curve[:-1])
        return self.best_step == self.curve[-1][0] and last < self._bar(before)


def fitted(budget: Budget, curve: list[float], epoch_steps: int = 1) -> bool:
    """Whether a run has nothing left to learn: the mean of the training loss over the
    last ``fitted_window`` steps of ``curve`` is at or below ``fitted_loss``. Never for an
    exact ``steps`` count (it reproduces a fixed run), before a full window, or before
    ``epoch_steps`` (one pass over the training examples): an example not yet seen is
    not learned, however low the loss of the others.

    Why one would: AdamW's step does not shrink with the gradient (it divides by the
    gradient's own running scale), so steps on examples already learned still move the
    weights by about ``lr`` each. Why it is off by default: on the agent quickstart such
    steps still generalised (80% held-out with them, 67% stopped at 0.01; the SFT
    learners' ``fitted_loss``, docs/training.md)."""
    floor, window = budget.fitted_loss, budget.fitted_window
    if floor is None or budget.steps is not None or len(curve) < max(window, epoch_steps):
        return False
    return sum(curve[-window:]) / window <= floor


def known(budget: Budget, curve: list[float], epoch_steps: int) -> bool:
    """Whether a run started out knowing its examples: ``curve`` holds exactly its first
    pass (``epoch_steps`` steps, each example's loss taken once, as it was first trained
    on) and that pass's mean training loss is at or below ``known_loss``. Checked only
    at the end of the first pass, so a run that was learning then makes its ``epochs``;
    never for an exact ``steps`` count.

    Why: a learner continuing from the serving adapter on traffic that adapter already
    answers right has little to learn, and ``epochs`` passes were set for new examples.
    One pass still trains on every example once, corrections included. Measured on the
    agent quickstart (docs/training.md): its second round, 90 steps continuing from the
    first round's adapter, starts at loss ~0 and its candidate was rejected on every run;
    its first round, from a fresh adapter, starts at 1.0 and is not touched."""
    floor = budget.known_loss
    if floor is None or budget.steps is not None or len(curve) != epoch_steps:
        return False
    return sum(curve) / epoch_steps <= floor


def time_stop(budget: Budget, elapsed: float) -> StopReason | None:
    """Why a run stops after ``elapsed`` seconds of training, if it must: the learning
    budget's deadline (``learning_budget``) before the recipe's own ``max_seconds``."""
    if budget.deadline_seconds is not None and elapsed > budget.deadline_seconds:
        return "learning_budget"
    if budget.max_seconds is not None and elapsed > budget.max_seconds:
        return "max_seconds"
    return None


def stop_report(
    reason: StopReason, stopper: EarlyStopping, steps_run: int, planned: int
) -> dict[str, object]:
    """What a run reports about its convergence: the reason, the validation curve, the
    best step and whether it looks undertrained."""
    has_validation = bool(stopper.curve)
    falling = stopper.still_falling()
    undertrained: bool | None = None
    if has_validation:
        undertrained = reason in ("completed", "max_steps", "max_seconds") and bool(falling)
    return {
        "stop_reason": reason,
        "steps_planned": planned,
        "steps_run": steps_run,
        "val_curve": [[step, loss] for step, loss in stopper.curve],
        "best_step": stopper.best_step if has_validation else None,
        "best_val_loss": round(stopper.best, 6) if has_validation else None,
        "undertrained": undertrained,
    }

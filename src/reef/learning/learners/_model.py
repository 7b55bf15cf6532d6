"""What the model learners (sft, preference, rl) share: their base class and settings,
how long to train (a budget in terms of the data), which model to train, where to work,
the head's adapter to continue from, and running the trainer and storing its adapter."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar, cast

from pydantic import Field

from reef.core.checkpoints import check_checkpoint_directory
from reef.core.errors import InvalidInputError
from reef.learning.base import Learner, LearnerConfig, LearnerContext
from reef.learning.trainers import (
    DEFAULT_TARGET_MODULES,
    Budget,
    TrainingDeadlineError,
    TrainResult,
    run_in_child,
)
from reef.learning.trainers.ray_runner import run_in_ray
from reef.learning.trainers.spec import LoraSettings, PreferenceSpec, RLSpec, SFTSpec
from reef.releases import FINGERPRINT_META_KEY, read_fingerprint

ENGINE_SOURCES = frozenset({"smollm2-135m", "tiny-random"})


def is_local_model(name: str) -> bool:
    """True when the engine can load ``name`` (a built-in source or a model directory)."""
    return name in ENGINE_SOURCES or (Path(name) / "config.json").is_file()


def model_source(learner: str, configured: str | None, context: LearnerContext) -> str:
    """The engine model source to train: the configured one, else the head's base model.
    Raises ``InvalidInputError`` when neither is one the engine can load."""
    if configured is not None:
        return configured
    base = context.head.manifest.model.base
    if is_local_model(base):
        return base
    raise InvalidInputError(
        f"{learner}: the head's base model {base!r} is not a local engine model; set "
        "`model:` to smollm2-135m, tiny-random or a model directory"
    )


def fresh_work_dir(context: LearnerContext, learner: str) -> Path:
    """An empty working directory for one run of ``learner``."""
    work = context.work_dir / learner
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def trained_weights(context: LearnerContext, model: str, work: Path) -> str:
    """What a LoRA run of ``model`` trains on: the head's checkpoint (a verified copy)
    when the head serves one of ``model``, so the adapter fits the weights it will be
    served on (the candidate keeps that checkpoint under the adapter); else ``model``."""
    start = head_checkpoint(context, work) if context.head.manifest.model.base == model else None
    return model if start is None else str(start)


def head_checkpoint(context: LearnerContext, work: Path) -> Path | None:
    """A verified copy of the head's checkpoint in ``work``, or None when the head
    serves none."""
    checkpoint = context.head.manifest.model.checkpoint
    if checkpoint is None:
        return None
    return context.artifacts.materialize(checkpoint, work / "base-checkpoint")


def head_adapter(
    context: LearnerContext, model: str, work: Path, continue_from_head: bool
) -> Path | None:
    """A verified copy of the head's adapter to continue from, or None when the head
    serves none, serves another base, or the learner starts fresh."""
    head = context.head.manifest.model
    if not continue_from_head or head.adapter is None or head.base != model:
        return None
    return context.artifacts.materialize(head.adapter, work / "base-adapter")


class BudgetSettings(LearnerConfig):
    """How long a model learner trains, in a recipe's terms (``reef.learning.trainers.
    budget``): ``epochs`` passes over its items, ``max_steps`` / ``max_minutes`` as caps, a
    ``validation_fraction`` split inside the trainer with early stopping after
    ``patience`` passes without a gain, warmup then ``lr_schedule``; ``steps`` trains
    exactly that many steps instead (no validation; a constant rate unless
    ``lr_schedule`` is set), for reproductions and tests."""

    epochs: float = Field(default=5.0, gt=0.0, le=1000.0)
    steps: int | None = Field(default=None, ge=1)
    max_steps: int | None = Field(default=None, ge=1)
    max_minutes: float | None = Field(default=30.0, gt=0.0)
    validation_fraction: float = Field(default=0.1, ge=0.0, le=0.5)
    patience: int = Field(default=3, ge=1)
    warmup_fraction: float | None = Field(default=None, ge=0.0, lt=1.0)
    lr_schedule: Literal["cosine", "linear", "constant"] | None = None

    def budget(self) -> Budget:
        """The trainer's budget."""
        return Budget(
            epochs=self.epochs,
            steps=self.steps,
            max_steps=self.max_steps,
            max_seconds=None if self.max_minutes is None else self.max_minutes * 60.0,
            validation_fraction=self.validation_fraction,
            patience=self.patience,
            warmup_fraction=self.warmup_fraction,
            schedule=self.lr_schedule,
        )


class ModelLearnerSettings(BudgetSettings):
    """What every model learner trains with, besides its budget: ``model`` (the engine
    model source; default the head's base model, ``model_source``), the LoRA shape (``r``,
    ``alpha``, ``dropout``, ``target_modules``), the optimiser's ``lr`` and
    ``batch_size``, ``max_seq_len``, ``continue_from_head`` (start from the head's adapter
    when it has one on the same base), ``seed``, where it runs (``device``, ``threads``),
    ``bf16`` (``auto``: on a CUDA device that supports it, float32 on a CPU; see
    ``reef.learning.trainers.precision``), ``timeout_seconds`` for the training
    process, and ``render_harness``: train each prompt under the candidate's harness as
    the gateway will serve it (None, the default: when the scenario's harness is
    ``managed``; ``reef.learning.learners._served``); ``demos``: with ``drop`` (the
    default) a harness it renders loses its few-shot demos, in training and in the
    candidate it serves; ``keep`` trains and serves with them (same module)."""

    model: str | None = None
    render_harness: bool | None = None
    demos: Literal["drop", "keep"] = "drop"
    lr: float = Field(default=5e-4, gt=0.0)
    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))
    batch_size: int = Field(default=4, ge=1)
    max_seq_len: int = Field(default=512, ge=8)
    continue_from_head: bool = True
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(default=None, ge=1)
    bf16: bool | Literal["auto"] = "auto"
    timeout_seconds: float | None = Field(default=3600.0, gt=0.0)

    def lora(self) -> LoraSettings:
        """The LoRA shape to train."""
        return LoraSettings(
            r=self.r, alpha=self.alpha, dropout=self.dropout, target_modules=self.target_modules
        )

    def run_settings(self) -> dict[str, Any]:
        """The settings every training run takes as they are (a spec's ``lr``,
        ``budget``, ``batch_size``, ``max_seq_len``, ``seed``, ``device``, ``threads``,
        ``bf16``):
        ``SFTSpec(..., **settings.run_settings())``."""
        return {
            "lr": self.lr,
            "budget": self.budget(),
            "batch_size": self.batch_size,
            "max_seq_len": self.max_seq_len,
            "seed": self.seed,
            "device": self.device,
            "threads": self.threads,
            "bf16": self.bf16,
        }


class RayTrainerSettings(ModelLearnerSettings):
    """A model learner whose trainer may run on Ray: ``trainer: local`` trains in a child
    process, ``ray`` as a Ray task on the cluster at ``ray_address`` (None: a local
    cluster on loopback)."""

    trainer: Literal["local", "ray"] = "local"
    ray_address: str | None = None


SettingsT = TypeVar("SettingsT", bound=ModelLearnerSettings)


class ModelLearner(Learner, Generic[SettingsT]):
    """A learner that trains a LoRA adapter; ``settings`` is its config, typed.

    ``learn`` trains on ``context.batch.train`` and returns the stored adapter's digest,
    the records used and the training metrics. It raises ``TrainingFailedError`` when the
    training child fails, ``InvalidInputError`` for an unusable model setting.
    """

    kind: ClassVar[Literal["harness", "model"]] = "model"

    def __init__(self, config: LearnerConfig) -> None:
        super().__init__(config)  # checks that config is a config_model
        self.settings = cast(SettingsT, config)


def train_adapter(
    context: LearnerContext,
    learner: str,
    spec: SFTSpec | PreferenceSpec | RLSpec,
    settings: ModelLearnerSettings,
    work: Path,
    meta: dict[str, Any],
) -> tuple[str, TrainResult]:
    """Train ``spec`` in a child process (or as a Ray task, for ``trainer: ray``), each
    step's loss recorded as the metric ``loss`` and reported as progress, then store the
    adapter. Returns its digest (artifact meta: learner, base, steps, then ``meta``) and
    the training result; raises ``TrainingFailedError`` when training fails. A ``full``
    SFT run's output is checked as a checkpoint and stored with kind ``checkpoint``.
    With ``context.training_minutes`` (what the learning budget has left) the trainer
    stops there, and a run that did raises ``TrainingDeadlineError``, its half-made
    adapter not stored."""
    if context.training_minutes is not None:
        deadline = max(context.training_minutes * 60.0, 1e-9)
        budget = spec.budget.model_copy(update={"deadline_seconds": deadline})
        spec = spec.model_copy(update={"budget": budget})

    def on_step(step: int, steps: int, loss: float) -> None:
        context.metrics.record("loss", loss)
        context.progress.report(step / steps, f"{learner}: step {step}/{steps} loss {loss:.4f}")

    timeout = settings.timeout_seconds
    if isinstance(settings, RayTrainerSettings) and settings.trainer == "ray":
        result = run_in_ray(spec, on_step, address=settings.ray_address, timeout_seconds=timeout)
    else:
        result = run_in_child(spec, on_step, work_dir=work, timeout_seconds=timeout)
    metrics = result.metrics
    if metrics.get("stop_reason") == "learning_budget":
        minutes = float(metrics.get("seconds", 0.0)) / 60.0
        planned = int(metrics.get("steps_planned", metrics["steps"]))
        raise TrainingDeadlineError(learner, minutes, int(metrics["steps"]), planned)
    stored = {"learner": learner, "base": spec.model, "steps": metrics["steps"], **meta}
    fingerprint = read_fingerprint(result.adapter_dir)  # in the directory: under its digest
    if fingerprint is not None:
        stored[FINGERPRINT_META_KEY] = fingerprint.as_json()
    if isinstance(spec, SFTSpec) and spec.mode == "full":
        check_checkpoint_directory(result.adapter_dir)  # safetensors only, complete shards
        return context.artifacts.put_dir(result.adapter_dir, "checkpoint", stored), result
    return context.artifacts.put_dir(result.adapter_dir, "adapter", stored), result

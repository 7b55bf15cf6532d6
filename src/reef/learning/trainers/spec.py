"""What a training child is asked to do and what it answers: pydantic models, because
both cross a process boundary as JSON files and lines. Torch-free."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reef.core.errors import ReefError
from reef.environments import TaskCount
from reef.learning.trainers.budget import Budget

DEFAULT_TARGET_MODULES = ("q_proj", "v_proj")

ProgressCallback = Callable[[int, int, float], None]
"""Called after every optimizer step with (step, total steps, loss: the step's mean),
in the caller's thread when a child trains (``runner.run_in_child``)."""


class TrainingFailedError(ReefError):
    """The training child failed: it exited non-zero, died by a signal, timed out or
    answered nothing. ``exit_status`` is the return code (negative: the signal number)
    or None after a timeout; ``log_tail`` the last lines it wrote."""

    def __init__(self, message: str, exit_status: int | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.exit_status = exit_status
        self.log_tail = log_tail


class TrainingDeadlineError(ReefError):
    """A trainer stopped at the learning budget's deadline (``Budget.deadline_seconds``):
    what it trained is half-made and was not stored. ``minutes`` is how long its loop
    ran; ``steps_run`` of ``steps_planned`` the steps it made."""

    def __init__(self, learner: str, minutes: float, steps_run: int, steps_planned: int) -> None:
        super().__init__(
            f"{learner}: the learning budget's training minutes ran out after "
            f"{steps_run} of {steps_planned} steps ({minutes:.4f} min)"
        )
        self.learner = learner
        self.minutes = minutes
        self.steps_run = steps_run
        self.steps_planned = steps_planned


class TeacherToken(BaseModel):
    """One token of a teacher's answer as its upstream sent it (OpenAI's
    ``logprobs.content[i]``): the token's text, its ``logprob`` and its ``top``
    alternatives, each ``(text, logprob)``, most likely first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str
    logprob: float = Field(allow_inf_nan=False)
    top: list[tuple[str, float]] = Field(default_factory=list)


def teacher_tokens(logprobs: Sequence[Mapping[str, Any]]) -> list[TeacherToken]:
    """An upstream's token logprobs (OpenAI's ``logprobs.content``: each token's
    ``token``, ``logprob`` and ``top_logprobs``) as :class:`TeacherToken` values. An
    entry without a token text or a finite logprob ends them (what follows cannot be
    placed in the answer); an alternative without them is left out."""
    out: list[TeacherToken] = []
    for item in logprobs:
        token, logprob = item.get("token"), item.get("logprob")
        if not isinstance(token, str) or not isinstance(logprob, int | float):
            break
        if not _finite(logprob):
            break
        top = [
            (alt["token"], float(alt["logprob"]))
            for alt in item.get("top_logprobs") or ()
            if isinstance(alt, Mapping)
            and isinstance(alt.get("token"), str)
            and _finite(alt.get("logprob"))
        ]
        out.append(TeacherToken(token=token, logprob=float(logprob), top=top))
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class SFTExample(BaseModel):
    """One supervised example: the conversation up to the reply (OpenAI form, content as
    text; assistant ``tool_calls`` and ``tool`` results kept) and the reply the model
    should give, as text (a reply's tool calls as the engine's ``<tool_call>`` blocks,
    ``reef.core.chat_format.assistant_text``). ``tools``: the tools the request offered,
    rendered as the engine renders them. ``weight`` scales its tokens' loss.
    ``teacher_tokens``: the target's tokens as the teacher gave them, with their top
    logprobs, for the logit-distillation term (``SFTSpec.logit_weight``); empty: none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[dict[str, Any]] = Field(min_length=1)
    target: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    teacher_tokens: list[TeacherToken] = Field(default_factory=list)


class LoraSettings(BaseModel):
    """The LoRA to train when starting fresh (a base adapter brings its own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))


class SFTSpec(BaseModel):
    """A LoRA SFT run. ``model`` is an engine model source (``smollm2-135m``,
    ``tiny-random`` or a model directory) loaded with ``reef.engine.models.load_model``
    under ``home``. ``base_adapter``: an adapter directory to continue from, or None to
    start fresh with ``lora``. ``budget``: how long to train (epochs over the examples,
    an internal validation split with early stopping, caps, the learning-rate schedule;
    ``reef.learning.trainers.budget``). ``device``: ``auto`` is CUDA when present.
    ``mode``: ``lora`` trains an adapter; ``full`` trains every weight of ``model`` (no
    LoRA; ``base_adapter`` and ``lora`` unused) and saves a checkpoint directory
    (safetensors shards, ``config.json``, tokenizer files) to ``output_dir``; to continue
    from a checkpoint, ``model`` is its directory and ``continued`` says so.
    ``gradient_checkpointing`` (``auto``: on CUDA) applies to a full run; ``bf16``
    (``auto``: on a CUDA device that supports it, float32 on a CPU) to every run, see
    ``reef.learning.trainers.precision``.
    ``probe_size``: after training, how many of the examples the trainer trained on to
    check for a greedy answer equal to the target (``reef.learning.trainers.probe``; 0:
    none); the result's ``metrics["probe"]`` lists ``[index, matched, target tokens]``.
    ``logit_weight``: above 0, each training step's loss adds that times the KL from
    the teacher's top-k distribution to the student's over the same tokens, on the
    target tokens that have the teacher's logprobs (``teacher_tokens``), both at
    ``logit_temperature`` (``reef.learning.trainers.logit_distill``); the validation loss
    stays the cross entropy.
    ``fault`` exists for tests only: ``abort`` kills the child by SIGABRT after step 1.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    model: str
    home: Path
    examples: list[SFTExample] = Field(min_length=1)
    logit_weight: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    logit_temperature: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    probe_size: int = Field(default=0, ge=0)
    output_dir: Path
    mode: Literal["lora", "full"] = "lora"
    continued: bool = False
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    bf16: bool | Literal["auto"] = "auto"
    base_adapter: Path | None = None
    lora: LoraSettings = Field(default_factory=LoraSettings)
    lr: float = Field(default=5e-4, gt=0.0)
    budget: Budget = Field(default_factory=Budget)
    batch_size: int = Field(default=4, ge=1)
    max_seq_len: int = Field(default=512, ge=8)
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(default=None, ge=1)
    fault: Literal["abort"] | None = None


class PreferencePair(BaseModel):
    """A DPO pair: one prompt (OpenAI form, content as text; assistant ``tool_calls``
    and ``tool`` results kept, as in :class:`SFTExample`), the reply to prefer and the
    reply to avoid (either may be tool calls, as the engine's ``<tool_call>`` blocks).
    ``tools``: the tools the request offered. ``weight`` scales the pair's loss."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[dict[str, Any]] = Field(min_length=1)
    chosen: str = Field(min_length=1)
    rejected: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    tools: list[dict[str, Any]] = Field(default_factory=list)


class UnpairedExample(BaseModel):
    """A KTO example: a prompt, a reply, and whether the reply is desirable (prompt,
    reply and ``tools`` as in :class:`PreferencePair`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[dict[str, Any]] = Field(min_length=1)
    target: str = Field(min_length=1)
    desirable: bool
    weight: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    tools: list[dict[str, Any]] = Field(default_factory=list)


DpoLossType = Literal["sigmoid", "hinge", "ipo"]
"""The DPO losses a recipe can select, each TRL's ``loss_type`` of that name
(tests/learning/test_trl_equality.py)."""


class PreferenceSpec(BaseModel):
    """A LoRA preference run: ``objective`` ``dpo`` trains on ``pairs``, ``kto`` on
    ``examples``. The reference model is the starting point (the base, or
    ``base_adapter``) with the trained adapter disabled. ``budget``: epochs over the
    pairs (or examples), validation and caps as in :class:`SFTSpec`. ``loss_type``: the
    DPO loss, as TRL's ``DPOConfig.loss_type`` of the same name. ``desirable_weight`` and
    ``undesirable_weight``: KTO's class weights, as TRL's ``KTOConfig``. Other fields as
    in :class:`SFTSpec`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    objective: Literal["dpo", "kto"]
    model: str
    home: Path
    pairs: list[PreferencePair] = Field(default_factory=list)
    examples: list[UnpairedExample] = Field(default_factory=list)
    output_dir: Path
    base_adapter: Path | None = None
    lora: LoraSettings = Field(default_factory=LoraSettings)
    beta: float = Field(default=0.1, gt=0.0)
    loss_type: DpoLossType = "sigmoid"
    desirable_weight: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    undesirable_weight: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    lr: float = Field(default=5e-4, gt=0.0)
    budget: Budget = Field(default_factory=lambda: Budget(epochs=3.0))
    batch_size: int = Field(default=4, ge=1)
    max_seq_len: int = Field(default=512, ge=8)
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool | Literal["auto"] = "auto"
    threads: int | None = Field(default=None, ge=1)
    fault: Literal["abort"] | None = None

    @model_validator(mode="after")
    def _has_data(self) -> PreferenceSpec:
        if self.objective == "dpo" and not self.pairs:
            raise ValueError("a dpo run needs pairs")
        if self.objective == "kto" and not self.examples:
            raise ValueError("a kto run needs examples")
        return self


class TrainResult(BaseModel):
    """What a finished run answers: ``adapter_dir`` is the directory it saved (an
    adapter, or a full run's checkpoint). ``metrics`` holds ``loss_curve`` (one mean loss per
    optimizer step), ``tokens`` (non-padding tokens fed), ``target_tokens`` (tokens
    with loss), ``seconds`` (the training loop), ``tokens_per_second``,
    ``load_seconds``, ``steps``, ``examples``, ``device`` and ``continued``; an SFT run
    adds its convergence report (``budget.stop_report``: ``stop_reason``, ``val_curve``,
    ``best_step``, ``undertrained``, …), ``train_examples``, ``val_examples`` and
    ``epochs_run``; a run on CUDA adds ``peak_memory_bytes`` (the most GPU memory torch
    held at once, load and save included); an SFT run, ``peak_rss_bytes`` (the most host
    memory its process held resident, None where unknown)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    adapter_dir: Path
    metrics: dict[str, Any]


class RLPrompt(BaseModel):
    """One RL prompt (OpenAI form, content as text) and the reference its completions
    are scored against. ``weight`` scales the prompt's loss."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[dict[str, Any]] = Field(min_length=1)
    reference: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)


GRPOLossType = Literal["dapo", "bnpo", "grpo", "dr_grpo", "sequence_sum"]
"""How GRPO's per-token losses are summed (``reef.learning.trainers.rl_loss``)."""

ScorerSpec = dict[str, Any] | str


def rl_scorer_spec(value: Any) -> Any:
    """An RL scorer spec as the evaluation scorers take it: the shape the ``rl``
    learner took before it used them, ``{type: contains, pattern: P}`` (``P`` a
    case-sensitive substring), becomes ``{type: regex, pattern: <P escaped>}``, which
    scores the same; anything else is passed through to be checked as a scorer spec."""
    if isinstance(value, dict) and value.get("type") == "contains" and "pattern" in value:
        pattern = value["pattern"]
        if isinstance(pattern, str):
            rest = {k: v for k, v in value.items() if k not in ("type", "pattern")}
            return {"type": "regex", "pattern": re.escape(pattern), **rest}
    return value


def check_scorer_spec(value: ScorerSpec, where: str) -> ScorerSpec:
    """``value`` when it names a registered scorer with valid settings (``reef.scorers``,
    as the gate builds them); raises ``ValueError`` saying what is wrong."""
    from reef.evaluation import ScorerError, ScorerRegistry

    registry = ScorerRegistry()
    try:
        type_name, settings = registry.spec_settings(value, where, names_allowed=True)
        registry.config(type_name, settings, where)
    except ScorerError as exc:
        raise ValueError(str(exc)) from exc
    return value


class RLSpec(BaseModel):
    """A LoRA GRPO run: ``budget.epochs`` passes over the prompts (caps and schedule as in
    :class:`SFTSpec`; no validation split), each step sampling ``group_size``
    completions for ``batch_size`` prompts, scoring them with ``scorer`` (an evaluation
    scorer spec, ``reef.evaluation.scorers``, the prompt's reference as the item's) and
    updating once. The objective (``reef.learning.trainers.rl_loss``, TRL's names and
    defaults): ``loss_type``, the clip range ``epsilon`` and ``epsilon_high`` (None:
    ``epsilon``), and ``beta_kl`` (TRL's ``beta``) weighing the k3 KL term to the reference
    (the starting point with the trained adapter disabled, or ``base_adapter`` as loaded;
    not computed at 0). ``engine_url``: sample
    through that engine's ``/v1/chat/completions`` (model ``engine_model``, default
    ``model``); None samples in the child with ``generate``. Other fields as in
    :class:`SFTSpec`.

    Over episodes instead of prompts: ``environment`` (a spec, as ``build_environment``
    takes it) replaces ``prompts``; each step plays ``group_size`` episodes of each of
    ``batch_size`` tasks (the first ``tasks`` of the environment's, or all),
    ``concurrency`` at once (default: one step's episodes all at once), and the episode's
    score is every one of its turns' reward. Without ``engine_url`` the child serves
    the policy itself, on an engine of its own synced after every update. A step's
    forward passes run ``micro_batch_tokens`` tokens at a time; a turn longer than
    ``max_seq_len`` is left out (and counted). See ``reef.learning.trainers.episode_training``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    model: str
    home: Path
    prompts: list[RLPrompt] = Field(default_factory=list)
    environment: dict[str, Any] | None = None
    tasks: TaskCount = "all"
    concurrency: int | None = Field(default=None, ge=1, le=64)
    micro_batch_tokens: int = Field(default=4096, ge=64)
    output_dir: Path
    scorer: ScorerSpec = "exact"
    base_adapter: Path | None = None
    lora: LoraSettings = Field(default_factory=LoraSettings)
    group_size: int = Field(default=4, ge=2)
    temperature: float = Field(default=1.0, gt=0.0)
    max_new_tokens: int = Field(default=64, ge=1)
    beta_kl: float = Field(default=0.0, ge=0.0)
    loss_type: GRPOLossType = "dapo"
    epsilon: float = Field(default=0.2, gt=0.0, lt=1.0)
    epsilon_high: float | None = Field(default=None, gt=0.0)
    lr: float = Field(default=5e-5, gt=0.0)
    budget: Budget = Field(default_factory=lambda: Budget(epochs=2.0))
    batch_size: int = Field(default=4, ge=1)
    max_seq_len: int = Field(default=512, ge=8)
    engine_url: str | None = None
    engine_model: str | None = None
    engine_timeout_seconds: float = Field(default=300.0, gt=0.0)
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool | Literal["auto"] = "auto"
    threads: int | None = Field(default=None, ge=1)
    fault: Literal["abort"] | None = None

    @field_validator("scorer", mode="before")
    @classmethod
    def _scorer(cls, value: Any) -> Any:
        return rl_scorer_spec(value)

    @field_validator("scorer")
    @classmethod
    def _known_scorer(cls, value: ScorerSpec) -> ScorerSpec:
        return check_scorer_spec(value, "rl.scorer")

    @model_validator(mode="after")
    def _one_source(self) -> RLSpec:
        if bool(self.prompts) == (self.environment is not None):
            raise ValueError(
                "an RL run takes prompts (single replies) or an environment (episodes): "
                "give exactly one"
            )
        return self

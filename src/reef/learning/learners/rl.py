"""``rl``: a LoRA adapter trained by GRPO, on single replies against a scorer or on
whole episodes of an environment.

Reads top to bottom: pick the prompts (an item's conversation, with its correction as
the reference the scorer compares against; items without a correction are skipped), with
the candidate's harness rendered in as the gateway will serve them (``render_harness``,
default: for a ``harness: managed`` scenario), or, with ``environment``, the
environment's tasks (the batch is not used; the episodes' prompts are the environment's
own); decide the model
and where to start (the head's adapter, or fresh), sample, score and train in a child
process (or a Ray task), store the adapter by digest.

Completions are scored by the evaluation scorers (``reef.scorers``, as the gate uses
them) in the training child; episodes by their environment.
Torch-free: training happens in ``reef.learning.trainers``' child process.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from reef.environments import EnvironmentRegistry, EnvironmentSpecError, TaskCount
from reef.harness import Harness
from reef.learning.base import (
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    TrainingExample,
)
from reef.learning.learners._examples import correction_text, text_messages
from reef.learning.learners._model import (
    ModelLearner,
    RayTrainerSettings,
    fresh_work_dir,
    head_adapter,
    model_source,
    train_adapter,
    trained_weights,
)
from reef.learning.learners._served import (
    served_harness,
    served_harness_output,
    served_prompt,
)
from reef.learning.trainers.spec import (
    GRPOLossType,
    RLPrompt,
    RLSpec,
    ScorerSpec,
    check_scorer_spec,
    rl_scorer_spec,
)


class RLConfig(RayTrainerSettings):
    """Settings of the ``rl`` learner (a recipe's learner entry minus ``type``).

    ``scorer``: how a completion is scored against the item's correction, an evaluation
    scorer spec (``exact``, ``normalized_exact``, ``contains``, ``regex``, …; the
    correction is the item's reference). The earlier ``{type: contains, pattern: P}``
    still reads, as the equivalent ``regex`` (``rl_scorer_spec``).
    ``group_size`` completions per prompt, sampled at ``temperature`` up to
    ``max_new_tokens``. The objective, with TRL's names and defaults
    (``reef.learning.trainers.rl_loss``): ``loss_type``, the clip range ``epsilon`` and
    ``epsilon_high`` (None: ``epsilon``), ``beta_kl`` (TRL's ``beta``) the weight of the
    KL term to the starting point.
    ``engine_url``: sample through a running engine (``engine_model``: the served model
    name, default ``model``); None samples inside the training child. Other settings
    as in ``SFTConfig``; ``batch_size`` is prompts per step; ``epochs`` how many groups
    each prompt gets (iterations over the prompts; no validation split).

    Over episodes: ``environment`` (a spec: ``type:`` and its settings, a relative
    ``tasks:`` path relative to the recipe) makes every step play ``group_size``
    episodes of each of ``batch_size`` tasks (the first ``tasks`` of the environment's,
    or all), ``concurrency`` at once, rewarded by the environment's score; without
    ``engine_url`` the training process serves the policy itself (see
    ``reef.learning.trainers.episode_training``). ``micro_batch_tokens`` bounds one forward
    pass; a turn longer than ``max_seq_len`` is left out. ``trainer: ray`` runs it as a
    Ray task.
    """

    scorer: ScorerSpec = "exact"
    group_size: int = Field(default=4, ge=2)
    temperature: float = Field(default=1.0, gt=0.0)
    max_new_tokens: int = Field(default=64, ge=1)
    loss_type: GRPOLossType = "dapo"
    epsilon: float = Field(default=0.2, gt=0.0, lt=1.0)
    epsilon_high: float | None = Field(default=None, gt=0.0)
    beta_kl: float = Field(default=0.0, ge=0.0)
    epochs: float = Field(default=2.0, gt=0.0, le=1000.0)
    lr: float = Field(default=5e-5, gt=0.0)
    engine_url: str | None = None
    engine_model: str | None = None
    environment: dict[str, Any] | None = None
    tasks: TaskCount = "all"
    concurrency: int | None = Field(default=None, ge=1, le=64)
    micro_batch_tokens: int = Field(default=4096, ge=64)

    @field_validator("scorer", mode="before")
    @classmethod
    def _scorer(cls, value: Any) -> Any:
        return rl_scorer_spec(value)

    @field_validator("scorer")
    @classmethod
    def _known_scorer(cls, value: ScorerSpec) -> ScorerSpec:
        return check_scorer_spec(value, "rl.scorer")

    @field_validator("environment")
    @classmethod
    def _known_environment(cls, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        if spec is not None:
            try:
                EnvironmentRegistry().check(spec, "rl.environment")
            except EnvironmentSpecError as exc:
                raise ValueError(str(exc)) from exc
        return spec


def rl_prompts(train: list[TrainingExample]) -> tuple[list[RLPrompt], list[str]]:
    """The prompts of ``train`` (reference: the correction) and the record ids used."""
    prompts: list[RLPrompt] = []
    used: list[str] = []
    for item in train:
        messages, reference = text_messages(item.messages), correction_text(item)
        if not messages or reference is None:
            continue
        prompts.append(RLPrompt(messages=messages, reference=reference, weight=item.weight))
        used.append(item.record_id)
    return prompts, used


def served_prompts(harness: Harness | None, prompts: list[RLPrompt]) -> list[RLPrompt]:
    """``prompts`` with ``harness`` rendered in, as the gateway will serve them
    (``reef.learning.learners._served``; the harness's tools aside: prompts are sampled
    as text); None: unchanged."""
    if harness is None:
        return prompts
    return [
        prompt.model_copy(update={"messages": served_prompt(harness, prompt.messages, [])[0]})
        for prompt in prompts
    ]


class RLLearner(ModelLearner[RLConfig]):
    """GRPO training of a LoRA adapter (see the module docstring)."""

    type_name: ClassVar[str] = "rl"
    config_model: ClassVar[type[LearnerConfig]] = RLConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        """GRPO on the batch's items with a correction, or on the environment's episodes
        (contract: ``ModelLearner``)."""
        cfg = self.settings
        prompts: list[RLPrompt] = []
        used: list[str] = []
        if cfg.environment is None:
            prompts, used = rl_prompts(context.batch.train)
            if not prompts:
                context.progress.report(1.0, "rl: no items with a reference; nothing to train")
                return LearnerOutput(metrics={"prompts": 0})
            prompts = served_prompts(served_harness(context, cfg), prompts)
        model = model_source("rl", self.settings.model, context)
        work = fresh_work_dir(context, "rl")
        spec = RLSpec(
            model=trained_weights(context, model, work),
            home=context.home,
            prompts=prompts,
            environment=cfg.environment,
            tasks=cfg.tasks,
            concurrency=cfg.concurrency,
            micro_batch_tokens=cfg.micro_batch_tokens,
            output_dir=work / "adapter",
            scorer=cfg.scorer,
            base_adapter=head_adapter(context, model, work, self.settings.continue_from_head),
            lora=cfg.lora(),
            group_size=cfg.group_size,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens,
            beta_kl=cfg.beta_kl,
            loss_type=cfg.loss_type,
            epsilon=cfg.epsilon,
            epsilon_high=cfg.epsilon_high,
            engine_url=cfg.engine_url,
            engine_model=cfg.engine_model or model,
            **cfg.run_settings(),
        )
        what = f"{len(prompts)} prompts" if cfg.environment is None else "episodes"
        context.progress.report(0.0, f"rl: grpo on {model} with {what}")
        meta = {"prompts": len(prompts)} if cfg.environment is None else {"episodes": True}
        digest, result = train_adapter(context, "rl", spec, cfg, work, meta)
        context.progress.report(1.0, f"rl: adapter {digest}")
        keys: tuple[str, ...] = ("loss_curve", "reward_curve", "kl_curve", "mean_reward")
        keys = (*keys, "samples", "tokens", "clip_low_curve", "clip_high_curve", "ratio_curve")
        budget = ("steps", "steps_planned", "stop_reason", "epochs_run")
        metrics = {k: result.metrics[k] for k in (*keys, *budget, "seconds", "sampler", "bf16")}
        metrics["loss_type"] = cfg.loss_type
        metrics.update(continued=result.metrics["continued"], base=model)
        if cfg.environment is None:
            metrics["prompts"] = len(prompts)
        else:
            episode_keys = ("success_curve", "model_calls", "turns", "tasks", "episodes_failed")
            metrics.update({k: result.metrics[k] for k in episode_keys})
            metrics["environment"] = cfg.environment.get("type")
        # An environment's episodes are prompted by the environment, not the harness.
        harness = served_harness_output(context, cfg) if cfg.environment is None else None
        return LearnerOutput(adapter=digest, harness=harness, consumed=used, metrics=metrics)

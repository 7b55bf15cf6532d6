"""``rl``: a LoRA adapter trained by GRPO against a scorer.

Reads top to bottom: pick the prompts (an item's conversation, with its correction as
the reference the scorer compares against; items without a correction are skipped),
decide the model and where to start (the head's adapter, or fresh), sample, score and
train in a child process, store the adapter by digest.

The scorer here (``exact``, ``contains``, ``regex``) is a minimal private one that runs
in the training child; the gate's ``reef.scorers`` plugins are not used here yet.
Torch-free: training happens in ``reef.learning.trainers``' child process.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from reef.learning.base import (
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    TrainingExample,
)
from reef.learning.learners._examples import correction_text, text_messages
from reef.learning.learners._model import (
    ModelLearner,
    ModelLearnerSettings,
    fresh_work_dir,
    head_adapter,
    model_source,
    train_adapter,
)
from reef.learning.trainers.spec import (
    RLPrompt,
    RLScorer,
    RLSpec,
)


class RLConfig(ModelLearnerSettings):
    """Settings of the ``rl`` learner (a recipe's learner entry minus ``type``).

    ``scorer``: how a completion is scored against the item's correction (``exact``,
    ``contains``, ``regex``; ``pattern`` replaces the correction as the thing to find).
    ``group_size`` completions per prompt, sampled at ``temperature`` up to
    ``max_new_tokens``; ``beta_kl`` weighs the KL guard to the starting point.
    ``engine_url``: sample through a running engine (``engine_model``: the served model
    name, default ``model``); None samples inside the training child. Other settings
    as in ``SFTConfig``; ``batch_size`` is prompts per step; ``epochs`` how many groups
    each prompt gets (iterations over the prompts; no validation split).
    """

    scorer: RLScorer = Field(default_factory=RLScorer)
    group_size: int = Field(default=4, ge=2)
    temperature: float = Field(default=1.0, gt=0.0)
    max_new_tokens: int = Field(default=64, ge=1)
    beta_kl: float = Field(default=0.04, ge=0.0)
    epochs: float = Field(default=2.0, gt=0.0, le=1000.0)
    lr: float = Field(default=5e-5, gt=0.0)
    engine_url: str | None = None
    engine_model: str | None = None


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


class RLLearner(ModelLearner[RLConfig]):
    """GRPO training of a LoRA adapter (see the module docstring)."""

    type_name: ClassVar[str] = "rl"
    config_model: ClassVar[type[LearnerConfig]] = RLConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        """GRPO on the batch's items with a correction (contract: ``ModelLearner``)."""
        cfg = self.settings
        prompts, used = rl_prompts(context.batch.train)
        if not prompts:
            context.progress.report(1.0, "rl: no items with a reference; nothing to train")
            return LearnerOutput(metrics={"prompts": 0})
        model = model_source("rl", self.settings.model, context)
        work = fresh_work_dir(context, "rl")
        spec = RLSpec(
            model=model,
            home=context.home,
            prompts=prompts,
            output_dir=work / "adapter",
            scorer=cfg.scorer,
            base_adapter=head_adapter(context, model, work, self.settings.continue_from_head),
            lora=cfg.lora(),
            group_size=cfg.group_size,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens,
            beta_kl=cfg.beta_kl,
            engine_url=cfg.engine_url,
            engine_model=cfg.engine_model,
            **cfg.run_settings(),
        )
        context.progress.report(0.0, f"rl: grpo on {model} with {len(prompts)} prompts")
        digest, result = train_adapter(context, "rl", spec, cfg, work, {"prompts": len(prompts)})
        context.progress.report(1.0, f"rl: adapter {digest}")
        keys = ("loss_curve", "reward_curve", "kl_curve", "mean_reward", "samples", "tokens")
        budget = ("steps", "steps_planned", "stop_reason", "epochs_run")
        metrics = {k: result.metrics[k] for k in (*keys, *budget, "seconds", "sampler")}
        metrics.update(prompts=len(prompts), continued=result.metrics["continued"], base=model)
        return LearnerOutput(adapter=digest, consumed=used, metrics=metrics)

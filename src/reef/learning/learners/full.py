"""``full``: every weight of the scenario's model fine-tuned on the ``sft`` learner's
examples; the result is a checkpoint artifact, not an adapter.

The same examples as ``sft`` (corrections and high-scoring replies, with the candidate's
harness rendered in for a ``harness: managed`` scenario, replay when continuing; the same
probe for the train/serve skew check), the same trainer in its
``full`` mode (no LoRA: all parameters trainable; gradient checkpointing and bf16
autocast where the hardware supports them). It continues from the head's checkpoint
when the head serves one (``continue_from_head``), else from the model itself. The
checkpoint (safetensors shards, ``config.json``, tokenizer files; never a pickle) is
checked (``reef.core.checkpoints``) and stored by digest, kind ``checkpoint``; the
candidate's manifest names it as ``model.checkpoint`` with no adapter.
Torch-free: training happens in ``reef.learning.trainers``' child process.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from reef.learning.base import LearnerConfig, LearnerContext, LearnerOutput
from reef.learning.learners._model import (
    ModelLearner,
    fresh_work_dir,
    head_checkpoint,
    model_source,
    train_adapter,
)
from reef.learning.learners._served import served_harness_output
from reef.learning.learners.sft import (
    REPORTED,
    SFTConfig,
    TrainingSet,
    examples_for,
    probed_prompts,
)
from reef.learning.skew import SKEW_SAMPLE
from reef.learning.trainers import SFTSpec


class FullConfig(SFTConfig):
    """Settings of the ``full`` learner: those of ``sft`` (the LoRA shape is unused)
    plus ``gradient_checkpointing`` (``auto``: on CUDA). ``lr`` defaults lower than a
    LoRA's: every weight moves."""

    lr: float = 2e-5
    gradient_checkpointing: bool | Literal["auto"] = "auto"


class FullLearner(ModelLearner[FullConfig]):
    """Full fine-tuning into a checkpoint (see the module docstring)."""

    type_name: ClassVar[str] = "full"
    config_model: ClassVar[type[LearnerConfig]] = FullConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        """Full SFT on the batch's corrections and high-score replies; returns the stored
        checkpoint's digest (contract: ``ModelLearner``)."""
        cfg = self.settings
        found = examples_for(context, cfg, context.batch.train)
        examples, used = found.examples, found.used
        if not examples:
            context.progress.report(
                1.0, "full: no corrections or high-score replies; nothing to train"
            )
            return LearnerOutput(metrics={"examples": 0})
        base = model_source("full", cfg.model, context)
        work = fresh_work_dir(context, "full")
        start = head_checkpoint(context, work) if cfg.continue_from_head else None
        replay = TrainingSet([], [], [])
        if cfg.replay and start is not None:
            replay = examples_for(context, cfg, context.batch.replay)
        replayed = replay.examples
        spec = SFTSpec(
            model=str(start) if start is not None else base,
            home=context.home,
            examples=examples + replayed,
            probe_size=SKEW_SAMPLE,
            output_dir=work / "checkpoint",
            mode="full",
            continued=start is not None,
            gradient_checkpointing=cfg.gradient_checkpointing,
            **cfg.run_settings(),
        )
        context.progress.report(
            0.0, f"full: training {base} on {len(examples)} examples + {len(replayed)} replayed"
        )
        meta = {
            "examples": len(examples),
            "base": base,
            "continued_from": context.head.manifest.model.checkpoint if start else None,
        }
        digest, result = train_adapter(context, "full", spec, cfg, work, meta)
        context.progress.report(1.0, f"full: checkpoint {digest} ({result.metrics['steps']} steps)")
        reported = (*REPORTED, "parameters")
        metrics = {k: result.metrics[k] for k in reported if k in result.metrics}
        metrics.update(examples=len(examples), replayed=len(replayed), base=base)
        probe = probed_prompts(found.prompts + replay.prompts, result)
        return LearnerOutput(
            checkpoint=digest,
            harness=served_harness_output(context, cfg),
            consumed=used,
            metrics=metrics,
            probe=probe,
        )

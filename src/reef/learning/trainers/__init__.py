"""Trainers: the training functions of the model learners and the child process that
runs them.

Owns: LoRA SFT training (``lora_sft.train_lora_sft``), its spec and result
(``SFTSpec``, ``TrainResult``), what an SFT run measured of its own fit for the
train/serve skew check (``probe``), the fingerprint written beside a saved adapter or
checkpoint (``fingerprint``; its format is ``reef.releases``'), the logit-distillation
term an SFT run adds for a teacher's top-k logprobs (``logit_distill``), and running it in
a child process (``run_in_child``), so a crash fails the job, never the worker.
Does not own: which experience becomes examples (the learners), storing the adapter
(``releases``), loading models (``reef.engine.models.load_model``, shared with the
engine so training and serving see one tokenizer and chat template).
Torch: this package is the only part of ``learning`` that may import torch,
transformers or peft, and only ``lora_sft`` does, which the parent never imports:
importing ``reef.learning.trainers`` stays torch-free.
Extend: a new method adds a spec, a training function and a ``method`` to the child's
command line (``python -m reef.learning.trainers``).
"""

from reef.learning.trainers.budget import Budget
from reef.learning.trainers.runner import run_in_child
from reef.learning.trainers.spec import (
    DEFAULT_TARGET_MODULES,
    LoraSettings,
    ProgressCallback,
    SFTExample,
    SFTSpec,
    TrainingDeadlineError,
    TrainingFailedError,
    TrainResult,
)

__all__ = [
    "DEFAULT_TARGET_MODULES",
    "Budget",
    "LoraSettings",
    "ProgressCallback",
    "SFTExample",
    "SFTSpec",
    "TrainResult",
    "TrainingDeadlineError",
    "TrainingFailedError",
    "run_in_child",
]

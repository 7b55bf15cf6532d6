"""The policy and its reference, as both RL trainers set them up (single replies,
``grpo``; episodes, ``episode_training``): the LoRA-wrapped model (``wrap_policy``) and
the reference model for a KL term or old log-probs (``as_reference``). Imports torch
and peft: only the training child or a test imports it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from peft import PeftModel

from reef.learning.trainers.lora_sft import wrap_lora
from reef.learning.trainers.spec import RLSpec


def wrap_policy(model: Any, spec: RLSpec) -> PeftModel:
    """The policy: ``model`` with the run's LoRA adapter (continued from
    ``spec.base_adapter`` when given, whose frozen copy is then the reference)."""
    wrapped = wrap_lora(model, spec.base_adapter, spec.lora)
    if spec.base_adapter is not None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing. is deprecated")
            # A frozen copy of the starting adapter is the reference.
            wrapped.load_adapter(str(spec.base_adapter), adapter_name="reference")
        wrapped.set_adapter("default")
    return wrapped


@contextlib.contextmanager
def as_reference(model: PeftModel, continued: bool) -> Iterator[None]:
    """The reference model for the duration: the adapter disabled, or the frozen copy."""
    if not continued:
        with model.disable_adapter():
            yield
        return
    model.set_adapter("reference")
    try:
        yield
    finally:
        model.set_adapter("default")
        # set_adapter marks only the active adapter trainable: keep the reference frozen.
        for name, param in model.named_parameters():
            param.requires_grad = "lora_" in name and ".default." in name

"""bfloat16 training: when it is on, and what it changes in the model.

``bf16: auto`` (every trainer's default) turns it on where it was measured to pay: a CUDA
device that supports it, or a CPU with AMX (``amx_bf16``), where a LoRA step on
SmolLM2-135M runs about 2x float32 (``bench/training.py``). A CPU with AVX-512 BF16 but no
AMX keeps float32 under ``auto``; ``bf16: true`` forces it anywhere.

With bf16 on, forward passes run under ``torch.autocast``; the trainable weights and the
optimizer state stay float32. Two more changes make it pay on a CPU:

- the frozen base of a LoRA run is stored in bfloat16 (nothing trains it, and autocast
  would otherwise cast every weight on every pass);
- attention runs ``eager``: the CPU's fused SDPA kernel backwards slower in bfloat16 than
  the plain matrix products do (measured; on CUDA SDPA is kept).
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import torch

from reef.engine.process import cpu_has_amx

BF16Setting = bool | Literal["auto"]


def use_bf16(setting: BF16Setting, device: torch.device) -> bool:
    """Whether a run on ``device`` trains under bf16 autocast (``auto``: see the module
    docstring)."""
    if setting != "auto":
        return bool(setting)
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return cpu_has_amx()


def prepare_bf16(model: Any, device: torch.device, bf16: bool) -> Any:
    """``model`` (on ``device``) made ready for bf16 training when ``bf16``: its frozen
    weights stored in bfloat16, and eager attention on a CPU. Returns the model."""
    if not bf16:
        return model
    for param in model.parameters():
        if not param.requires_grad and param.dtype == torch.float32:
            param.data = param.data.to(torch.bfloat16)
    if device.type == "cpu":
        model.set_attn_implementation("eager")
    return model


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager[Any]:
    """The context forward passes run in: bf16 autocast when ``bf16``, else nothing."""
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)

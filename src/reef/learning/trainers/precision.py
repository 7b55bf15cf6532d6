"""bfloat16 training: when it is on, and what it changes in the model.

``bf16: auto`` (every trainer's default) turns it on on a CUDA device that supports it.
On a CPU ``auto`` stays float32, measured: on an AMX Xeon bf16 trains a LoRA step on
SmolLM2-135M 1.4-1.8x faster (``bench/training.py``), but the quickstart's first round
reached 27% held-out accuracy with it against 68% in float32 (same machine, same seed;
docs/training.md). ``bf16: true`` turns it on anywhere; ``reef.engine.process.cpu_has_amx``
says where it pays.

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

BF16Setting = bool | Literal["auto"]


def use_bf16(setting: BF16Setting, device: torch.device) -> bool:
    """Whether a run on ``device`` trains under bf16 autocast (``auto``: see the module
    docstring)."""
    if setting != "auto":
        return bool(setting)
    return device.type == "cuda" and bool(torch.cuda.is_bf16_supported())


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

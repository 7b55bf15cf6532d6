"""Weight-only int8: the decoder layers' linear weights held as int8, one scale per
output row; embeddings, norms, the output head and every activation stay bfloat16.

Why: decoding a token reads every weight once, so a CPU decodes as fast as its matrix
products read weights. Measured on an AMD EPYC (one torch thread, SmolLM2-135M's 30
layers of projections, 430 MB in float32): torch's float32 matrix-vector products read
~11 GB/s, its bfloat16 ones ~6 GB/s (so bfloat16 weights barely beat float32 in the
layers), and its int8 weight-only kernel (``torch._weight_int8pack_mm``, bfloat16 in
and out) runs the same layers in ~0.4x float32's time. The kernel is slow with float32
inputs, hence bfloat16 activations.

Approximate: rounding a weight to one of 255 steps of its row's largest magnitude
changes the logits a little, so greedy answers follow float32's for a while and may then
take another token where two were close (docs/engine.md has the measured agreement).

LoRA adapters keep working: :class:`Int8Linear` is an ``nn.Linear`` to PEFT, which wraps
it as any linear layer and runs the adapter's own layers beside it.
"""

from __future__ import annotations

import torch
from torch import nn

INT8_STEPS = 127
"""Largest quantized magnitude: symmetric rounding to [-127, 127]."""


class Int8Linear(nn.Linear):
    """A linear layer whose weight is int8 with a per-output-row scale.

    ``forward(x)`` is ``x @ (weight * scales[:, None]).T`` computed by torch's int8
    weight-only kernel, in ``x``'s dtype (bfloat16); no bias (Llama-style projections
    have none: :func:`quantize_int8` leaves a layer with a bias alone).
    """

    scales: torch.Tensor

    def __init__(self, linear: nn.Linear, activation_dtype: torch.dtype = torch.bfloat16):
        nn.Module.__init__(self)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach().float()
        exact = weight.abs().amax(dim=1) / INT8_STEPS
        # The kernel takes the scales in the activations' dtype: round them first (up,
        # so a row's largest weight still fits in 127 steps), then quantize with them.
        scales = exact.to(activation_dtype)
        short = scales.float() < exact
        scales = torch.where(short, torch.nextafter(scales, torch.full_like(scales, 1.0)), scales)
        scales = scales.clamp(min=torch.finfo(activation_dtype).tiny)
        steps = torch.round(weight / scales.float()[:, None]).clamp(-INT8_STEPS, INT8_STEPS)
        self.weight = nn.Parameter(steps.to(torch.int8), requires_grad=False)
        self.register_buffer("scales", scales)
        self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).to(self.scales.dtype)
        out = torch._weight_int8pack_mm(flat, self.weight, self.scales)
        return out.view(*shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The weight this layer computes with, as float32 (for checks)."""
        return self.weight.float() * self.scales.float()[:, None]


def quantize_int8(model: nn.Module, activation_dtype: torch.dtype = torch.bfloat16) -> int:
    """Replace every bias-free ``nn.Linear`` in ``model``'s decoder layers with an
    :class:`Int8Linear` (the output head, tied to the embeddings, stays as it is);
    return how many were replaced. The model should already be in ``activation_dtype``.
    Call before any adapter is loaded (PEFT wraps the layers it finds)."""
    decoder = getattr(model, "model", model)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no decoder layers to quantize")
    replaced = 0
    for layer in layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear and child.bias is None:
                    setattr(parent, name, Int8Linear(child, activation_dtype))
                    replaced += 1
    return replaced


def is_int8(model: nn.Module) -> bool:
    """Whether ``model`` holds :class:`Int8Linear` layers."""
    return any(isinstance(module, Int8Linear) for module in model.modules())


def load_dtype(precision: str) -> torch.dtype:
    """The dtype to load weights in for an engine ``precision`` (``float32``,
    ``bfloat16``, ``int8``: loaded in bfloat16, then :func:`quantize_int8`)."""
    return torch.float32 if precision == "float32" else torch.bfloat16


def apply_precision(model: nn.Module, precision: str) -> nn.Module:
    """``model`` (loaded in :func:`load_dtype`'s dtype) made ready for ``precision``."""
    if precision == "int8":
        quantize_int8(model)
    return model


def precision_of(model: nn.Module) -> str:
    """The precision ``model`` serves in: ``int8``, or its weights' dtype name."""
    if is_int8(model):
        return "int8"
    return str(next(model.parameters()).dtype).removeprefix("torch.")

"""The engine's precisions: how the weights are held and multiplied on a CPU.

Decoding a token reads every weight once, so a CPU decodes as fast as its matrix
products read weights. Measured on an AMD EPYC (one torch thread, SmolLM2-135M's 30
layers of projections, one row at a time): torch's own float32 products read ~11 GB/s
and its bfloat16 ones only ~6 GB/s, so bfloat16 weights barely beat float32 there. Two
layer types close that gap:

- :class:`PackedLinear` (``bfloat16``, and the int8 engine's output head): the weight
  reordered once into oneDNN's blocked layout and multiplied by oneDNN's linear kernel,
  the path torch's own compiler takes on a CPU. The 30 layers: ~17 ms against ~34 ms
  per decoded row (1.25-1.3x for prompts), the same arithmetic (bfloat16 products,
  float32 sums), so answers are those of the plain bfloat16 layers.
- :class:`Int8Linear` (``int8``): weight-only int8, one bfloat16 scale per output row,
  torch's int8 weight-only kernel (``torch._weight_int8pack_mm``) with bfloat16
  activations (it is slow with float32 ones): ~16 ms for the same layers, half the
  weights' memory, and more approximate (each weight is one of 255 steps of its row's
  largest magnitude).

LoRA adapters keep working: both are an ``nn.Linear`` to PEFT, which wraps them as any
linear layer and runs the adapter's own layers beside them. float32 stays torch's own
layers: it is the reference the others are measured against.
"""

from __future__ import annotations

import torch
from torch import nn

from reef.engine.decoder import fuse_projections

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


class PackedLinear(nn.Linear):
    """A bias-free linear layer whose weight (bfloat16) is held in oneDNN's blocked
    layout, reordered once here, and multiplied by oneDNN's linear kernel.

    ``weight`` is that packed tensor (an opaque layout: read ``in_features`` and
    ``out_features`` for the shape); the original weight is not kept.
    """

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            flat, self.weight, None, "none", [], ""
        )
        return out.view(*shape[:-1], self.out_features)


def can_pack(model: nn.Module) -> bool:
    """Whether :class:`PackedLinear` can serve ``model``: bfloat16 weights on a CPU, with
    torch built with oneDNN, on a CPU whose instructions oneDNN's bfloat16 kernels need
    (AVX-512 BW/VL/DQ or AVX-NE-CONVERT: an AVX2-only CPU keeps torch's own layers)."""
    weight = next(model.parameters())
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def pack_linears(model: nn.Module, head_only: bool = False) -> int:
    """Replace ``model``'s bias-free bfloat16 ``nn.Linear`` layers (the decoder layers'
    and the output head; only the head with ``head_only``) with :class:`PackedLinear`;
    return how many. A head tied to the input embeddings gets a packed copy of its own.
    Call before any adapter is loaded."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear or child.bias is not None:
                continue
            if child.weight.dtype != torch.bfloat16 or (head_only and name != "lm_head"):
                continue
            setattr(parent, name, PackedLinear(child))
            replaced += 1
    return replaced


def load_dtype(precision: str) -> torch.dtype:
    """The dtype to load weights in for an engine ``precision`` (``float32``,
    ``bfloat16``, ``int8``: loaded in bfloat16, then :func:`quantize_int8`)."""
    return torch.float32 if precision == "float32" else torch.bfloat16


def apply_precision(model: nn.Module, precision: str) -> nn.Module:
    """``model`` (loaded in :func:`load_dtype`'s dtype) made ready for ``precision``:
    fused projections (:func:`reef.engine.decoder.fuse_projections`), int8 layers, and
    packed bfloat16 layers where oneDNN can serve them."""
    fuse_projections(model)
    if precision == "int8":
        quantize_int8(model)
    if precision in ("bfloat16", "int8") and can_pack(model):
        pack_linears(model, head_only=precision == "int8")
    return model


def precision_of(model: nn.Module) -> str:
    """The precision ``model`` serves in: ``int8``, or its weights' dtype name."""
    if is_int8(model):
        return "int8"
    return str(next(model.parameters()).dtype).removeprefix("torch.")

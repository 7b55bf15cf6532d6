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

- :class:`Fp16Linear` (``float16``): weights held in float16, packed once for fbgemm's
  half-precision GEMM, which converts them to float32 as it reads them; activations,
  products and sums stay float32. For CPUs without native bfloat16 (AVX2 only), where
  float32 products run far from the memory's speed: on an AMD EPYC (AVX2, one thread)
  the 30 layers take ~10-12 ms per decoded row against float32's ~42 ms, and ~25-30 ms
  for 8 rows against ~66 ms. Rounding a weight to float16 moves it by at most 2^-11 of
  its magnitude (bfloat16: 2^-8). The packed weight is not a tensor: ``weight`` is a
  stand-in (:meth:`Fp16Linear.dequantized` gives the weight, slowly).

LoRA adapters keep working: each is an ``nn.Linear`` to PEFT, which wraps them as any
linear layer and runs the adapter's own layers beside them (in float32 next to an
:class:`Fp16Linear`). float32 stays torch's own layers: it is the reference the others
are measured against.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, cast

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


FP16_MAX = 65504.0
"""Largest finite float16: a weight beyond it cannot be held in float16."""

# torch marks these two deprecated in favour of the quantized ops, which run the same
# fbgemm kernel with more work per call (~17 against ~11 ms for the 30 layers of one
# row, measured side by side): used while torch has them.
_PACK_DIRECT: Any = getattr(torch, "fbgemm_pack_gemm_matrix_fp16", None)
_LINEAR_DIRECT: Any = getattr(torch, "fbgemm_linear_fp16_weight_fp32_activation", None)


@functools.cache
def _use_direct() -> bool:
    """Whether the direct fbgemm ops can run. Each warns of its deprecation once per
    process, on its first call: that call is made here, with the warning silenced, so no
    product of a served request warns (nor pays for silencing)."""
    if _PACK_DIRECT is None or _LINEAR_DIRECT is None:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            packed = _PACK_DIRECT(torch.ones(1, 1))
            _LINEAR_DIRECT(torch.ones(1, 1), packed, torch.zeros(1))
    except RuntimeError:
        return False
    return True


class Fp16Linear(nn.Linear):
    """A linear layer whose weight is float16, packed for fbgemm's half-precision GEMM.

    ``forward(x)`` is ``x @ weight.T + bias`` with the float16 weight widened to float32
    as the kernel reads it: float32 activations, products and sums. The packed weight is
    no tensor: ``weight`` is a NaN stand-in of its shape (:meth:`dequantized` unpacks
    the weight, slowly); ``compute_dtype`` (float32) tells PEFT the dtype to keep an
    adapter's layers in.
    """

    compute_dtype = torch.float32

    def __init__(self, linear: nn.Linear, direct: bool | None = None) -> None:
        nn.Module.__init__(self)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach().float().contiguous()
        largest = float(weight.abs().max()) if weight.numel() else 0.0
        if not largest <= FP16_MAX:
            raise ValueError(
                f"a weight of magnitude {largest:g} does not fit in float16 (largest "
                f"{FP16_MAX:g}): serve this model in float32 or bfloat16"
            )
        bias = linear.bias.detach().float().contiguous() if linear.bias is not None else None
        self.direct = _use_direct() if direct is None else direct and _use_direct()
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.register_buffer("bias", bias)
        # What the direct kernel adds (it takes a bias tensor, zeros for none): a plain
        # attribute, read on every call without nn.Module's lookup.
        self._addend = bias if bias is not None else torch.zeros(self.out_features)
        self._stand_in = torch.full((1, 1), float("nan")).expand(
            self.out_features, self.in_features
        )
        if self.direct:
            self._packed = _PACK_DIRECT(weight)
        else:
            self._packed = torch.ops.quantized.linear_prepack_fp16(weight, bias)

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        """A stand-in for PEFT, which reads a linear layer's weight for its shape, device
        and dtype: float32, the right shape, every value NaN (one element, broadcast),
        so that anything computing with it gets NaN, never a plausible wrong answer.
        :meth:`dequantized` gives the weight."""
        return self._stand_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).float()
        if self.direct:
            out: torch.Tensor = _LINEAR_DIRECT(flat, self._packed, self._addend)
        else:
            out = torch.ops.quantized.linear_dynamic_fp16(flat, self._packed)
        return out.view(*shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The weight this layer computes with, as float32 (for checks)."""
        if self.direct:
            # the direct packing has no unpack: multiply the identity
            eye = torch.eye(self.in_features)
            zero = torch.zeros(self.out_features)
            columns: torch.Tensor = _LINEAR_DIRECT(eye, self._packed, zero)
            return columns.t().contiguous()
        weight, _ = torch.ops.quantized.linear_unpack_fp16(self._packed)
        return cast(torch.Tensor, weight).float()

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, float16 weights (fbgemm)"
        )


@functools.cache
def can_fp16() -> str | None:
    """Why :class:`Fp16Linear` cannot serve on this machine, or None when it can: torch
    needs fbgemm (x86 builds), and fbgemm a CPU with AVX2 and F16C; checked once per
    process by running one small product against float32."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return "this torch build has no fbgemm (it ships for x86 CPUs only)"
    probe = nn.Linear(16, 8, bias=True)
    with torch.no_grad():
        probe.weight.copy_(torch.linspace(-1, 1, 128).view(8, 16))
        probe.bias.copy_(torch.linspace(-1, 1, 8))
    x = torch.linspace(-2, 2, 32).view(2, 16)
    try:
        out = Fp16Linear(probe)(x)
    except RuntimeError as exc:
        return f"fbgemm's float16 product fails on this CPU ({exc}); it needs AVX2 and F16C"
    if not torch.allclose(out, probe(x).detach(), atol=1e-2):
        return "fbgemm's float16 product gives wrong sums on this CPU"
    return None


def pack_fp16(model: nn.Module) -> int:
    """Replace ``model``'s float32 ``nn.Linear`` layers (the decoder layers' projections,
    fused or not, and the output head; a head tied to the input embeddings gets a packed
    copy of its own) with :class:`Fp16Linear`; return how many. Call before any adapter
    is loaded."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32:
                setattr(parent, name, Fp16Linear(child))
                replaced += 1
    return replaced


def is_fp16(model: nn.Module) -> bool:
    """Whether ``model`` holds :class:`Fp16Linear` layers."""
    return any(isinstance(module, Fp16Linear) for module in model.modules())


def load_dtype(precision: str) -> torch.dtype:
    """The dtype to load weights in for an engine ``precision`` (``float32``;
    ``float16``: loaded in float32, then :func:`pack_fp16`; ``bfloat16``; ``int8``:
    loaded in bfloat16, then :func:`quantize_int8`)."""
    return torch.float32 if precision in ("float32", "float16") else torch.bfloat16


def apply_precision(model: nn.Module, precision: str) -> nn.Module:
    """``model`` (loaded in :func:`load_dtype`'s dtype) made ready for ``precision``:
    fused projections (:func:`reef.engine.decoder.fuse_projections`), float16 or int8
    layers, and packed bfloat16 layers where oneDNN can serve them. Raises ``ValueError``
    for ``float16`` where fbgemm cannot run (:func:`can_fp16`)."""
    fuse_projections(model)
    if precision == "float16":
        reason = can_fp16()
        if reason is not None:
            raise ValueError(f"precision float16 cannot run here: {reason}; use float32")
        pack_fp16(model)
    if precision == "int8":
        quantize_int8(model)
    if precision in ("bfloat16", "int8") and can_pack(model):
        pack_linears(model, head_only=precision == "int8")
    return model


def precision_of(model: nn.Module) -> str:
    """The precision ``model`` serves in: ``int8``, ``float16``, or its weights' dtype
    name."""
    if is_int8(model):
        return "int8"
    if is_fp16(model):
        return "float16"
    return str(next(model.parameters()).dtype).removeprefix("torch.")

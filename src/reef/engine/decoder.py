"""A lean forward pass for Llama-family decoders: the engine's prefill and decode steps.

Hugging Face's model forward is written for every case (training, generation, many
attention kernels, hooks); a decode step of SmolLM2-135M through it spends about a third
of its time outside the matrix products: a 4-D mask rebuilt each step, ~40 small ops per
layer, and, in bfloat16, torch's flash-attention kernel, which takes ~0.75 ms per layer
for 8 rows of one query each (22 of a 56 ms step on an AMD EPYC). This pass runs the same
layers' own modules (so PEFT's LoRA layers, the packed and int8 projections all apply)
with fewer ops around them:

- each layer's query, key and value projections are one matrix product, and so are the
  MLP's gate and up projections (:func:`fuse_projections`, applied when the engine loads
  a model): five calls of a few hundred microseconds each become two, and a LoRA
  adapter's delta is added to each projection's columns of the fused product;
- the padding mask is built once per step, and left out when no row has padding;
- rotary embeddings are applied to queries and keys together, with ``roll`` in place of
  ``rotate_half``'s slice-negate-concatenate (the same products: negation is exact);
- attention is torch's scaled-dot-product kernel in float32 whatever the weights' dtype:
  keys and values are cached in float32 (in bfloat16 the kernel is several times slower
  on a CPU: ~0.75 ms against ~0.29 ms per layer for 8 rows; the cache is then as large as
  a float32 model's);
- only the last position reaches the final norm and the output head.

float32 logits are those of the Hugging Face forward to ~1e-4 on SmolLM2-135M, with the
same greedy tokens (some sums run in another order), and to 1e-5 on the tiny Llama,
Mistral and Qwen2 models of tests/engine/test_decoder.py; bfloat16 ones differ more
(attention is float32 here, bfloat16 there) and are checked against float32 as every
precision is (docs/engine.md#precision).

:func:`supports` says which models take this pass; any other model runs Hugging Face's.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from peft.tuners.lora import LoraLayer
from torch import nn
from transformers import DynamicCache, PreTrainedModel

LEAN_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})
"""Decoders whose layers are Llama's: pre-norm RMSNorm, q/k/v/o projections, rotary
embeddings on every layer, a gated MLP. (Qwen2's projections carry biases; the modules
apply them.)"""


def supports(model: nn.Module) -> bool:
    """Whether :func:`forward_last` can run ``model``: a Llama-family causal LM whose
    layers all attend to every earlier position, with the modules this pass calls."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or inner is None:
        return False
    if getattr(config, "model_type", None) not in LEAN_MODEL_TYPES:
        return False
    window = getattr(config, "sliding_window", None)
    if window and (config.model_type != "qwen2" or getattr(config, "use_sliding_window", False)):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types and any(kind != "full_attention" for kind in layer_types):
        return False
    layers = getattr(inner, "layers", None)
    modules = ("embed_tokens", "norm", "rotary_emb")
    if not layers or not all(hasattr(inner, name) for name in modules):
        return False
    first = layers[0]
    parts = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
    return all(hasattr(first, name) for name in parts) and not hasattr(first.self_attn, "q_norm")


Rows = torch.Tensor | slice
"""The rows of a batch one adapter runs on: a contiguous run as a ``slice`` (a view: no
gather of the inputs nor scatter of the delta), any other set as an index tensor
(:func:`adapter_groups`)."""


def adapter_groups(adapter_names: list[str], base: str) -> dict[str, Rows]:
    """Each adapter named in ``adapter_names`` (one per row; ``base`` for none) with the
    rows it runs on, as :data:`Rows`."""
    found: dict[str, list[int]] = {}
    for row, name in enumerate(adapter_names):
        if name != base:
            found.setdefault(name, []).append(row)
    groups: dict[str, Rows] = {}
    for name, rows in found.items():
        contiguous = rows[-1] - rows[0] + 1 == len(rows)
        groups[name] = slice(rows[0], rows[-1] + 1) if contiguous else torch.tensor(rows)
    return groups


FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""Fused projection -> the projections it replaces, in the order of its output columns."""


class SliceLinear(nn.Linear):
    """One projection of a fused layer: columns ``start:end`` of the fused product.

    It holds no weight of its own: ``weight`` is its rows of the fused layer's weight (a
    view; the whole packed weight where oneDNN's layout cannot be sliced), for PEFT, which
    reads a wrapped layer's dtype and device from it and DoRA its norms. It computes the
    whole fused product to return its part: only Hugging Face's forward calls it (the
    lean pass calls the fused layer once).
    """

    def __init__(self, owner: nn.Module, fused: str, start: int, end: int, in_features: int):
        nn.Module.__init__(self)
        # a plain attribute, not a submodule: the module tree keeps no cycle
        object.__setattr__(self, "_owner", owner)
        self.fused_name = fused
        self.start, self.end = start, end
        self.in_features = in_features
        self.out_features = end - start
        self.register_parameter("bias", None)

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        whole = cast(torch.Tensor, getattr(self._owner, self.fused_name).weight)
        if whole.layout != torch.strided:
            return whole
        return whole[self.start : self.end]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = cast(nn.Module, getattr(self._owner, self.fused_name))
        out: torch.Tensor = fused(x)
        return out[..., self.start : self.end]


def fuse_projections(model: nn.Module) -> int:
    """Replace each layer's q/k/v projections by one ``qkv_proj`` and its gate/up
    projections by one ``gate_up_proj`` (weights concatenated, the originals freed;
    :class:`SliceLinear` layers stand in their place); return how many fused layers were
    made. Only plain ``nn.Linear`` layers of a model :func:`supports` are fused; call it
    before quantizing or packing (those then treat a fused layer as any other) and before
    any adapter is loaded."""
    if not supports(model):
        return 0
    made = 0
    for layer in model.model.layers:  # type: ignore[union-attr]
        for owner in (layer.self_attn, layer.mlp):
            for fused_name, names in FUSED.items():
                if all(hasattr(owner, name) for name in names):
                    made += _fuse(owner, fused_name, names)
    return made


def _fuse(owner: nn.Module, fused_name: str, names: tuple[str, ...]) -> int:
    parts = [getattr(owner, name) for name in names]
    if any(type(part) is not nn.Linear for part in parts):
        return 0
    if len({(part.in_features, part.weight.dtype) for part in parts}) != 1:
        return 0
    with_bias = [part.bias is not None for part in parts]
    if any(with_bias) and not all(with_bias):
        return 0
    in_features = parts[0].in_features
    widths = [part.out_features for part in parts]
    fused = nn.Linear(in_features, sum(widths), bias=all(with_bias), device="meta")
    weight = torch.cat([part.weight.detach() for part in parts])
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if all(with_bias):
        bias = torch.cat([part.bias.detach() for part in parts])
        fused.bias = nn.Parameter(bias, requires_grad=False)
    setattr(owner, fused_name, fused)
    start = 0
    for name, width in zip(names, widths, strict=True):
        setattr(owner, name, SliceLinear(owner, fused_name, start, start + width, in_features))
        start += width
    return 1


def _add_lora(
    owner: nn.Module,
    names: tuple[str, ...],
    x: torch.Tensor,
    out: torch.Tensor,
    groups: dict[str, Rows],
) -> None:
    """Add to ``out`` (a fused product of ``x``) the delta of each LoRA adapter on the
    projections ``names``, for the rows ``groups`` give each adapter: what PEFT's
    mixed-batch forward adds to each projection's own product."""
    start = 0
    for name in names:
        module = getattr(owner, name)
        base = module.get_base_layer() if isinstance(module, LoraLayer) else module
        end = start + cast(int, base.out_features)
        if isinstance(module, LoraLayer):
            for adapter, rows in groups.items():
                if adapter not in module.lora_A:
                    continue
                lora_a, lora_b = module.lora_A[adapter], module.lora_B[adapter]
                sub = x[rows].to(cast(torch.Tensor, lora_a.weight).dtype)
                delta = lora_b(lora_a(module.lora_dropout[adapter](sub))) * module.scaling[adapter]
                out[rows, :, start:end] += delta.to(out.dtype)
        start = end


def _fused_product(
    owner: nn.Module, fused_name: str, x: torch.Tensor, groups: dict[str, Rows]
) -> torch.Tensor | None:
    """``owner``'s fused layer applied to ``x`` with its parts' LoRA deltas added; None
    when ``owner`` was not fused."""
    fused = getattr(owner, fused_name, None)
    if fused is None:
        return None
    out: torch.Tensor = fused(x)
    if groups:
        _add_lora(owner, FUSED[fused_name], x, out, groups)
    return out


def _rms_norm(norm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``LlamaRMSNorm``'s arithmetic, op for op (float32 statistics, weight in the
    input's dtype)."""
    dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    epsilon = float(norm.variance_epsilon)  # type: ignore[arg-type]
    hidden = hidden * torch.rsqrt(variance + epsilon)
    weight = cast(torch.Tensor, norm.weight)
    return weight * hidden.to(dtype)


class LeanDecoder:
    """The forward pass of one Llama-family model (see the module docstring).

    Holds the decoder layers, never their projections: PEFT replaces those in place when
    an adapter loads, so they are looked up on every call.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        if not supports(model):
            raise TypeError(f"{type(model).__name__} is not a Llama-family decoder")
        config = model.config
        self.model = model
        self.inner = model.model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.scaling = self.head_dim**-0.5
        self.layers = list(self.inner.layers[: config.num_hidden_layers])

    def forward_last(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
        adapter_rows: dict[str, Rows] | None = None,
    ) -> torch.Tensor:
        """Run ``input_ids`` (``[rows, new]``) after what ``cache`` holds, writing their
        keys and values into it; return the logits of each row's last position
        (``[rows, vocab]``, the model's dtype). ``attention_mask`` (``[rows, columns]``,
        1 for a real token) covers the cached columns and the new ones; ``position_ids``
        (``[rows, new]``) are each new token's position in its own sequence.
        ``adapter_rows`` maps each LoRA adapter (its PEFT name) to the rows it runs on,
        for the fused projections; the other layers get theirs from PEFT's hooks."""
        groups = adapter_rows or {}
        rows, new = input_ids.shape
        columns = attention_mask.shape[1]
        hidden = self.inner.embed_tokens(input_ids)
        dtype = hidden.dtype
        cos, sin = self.inner.rotary_emb(hidden, position_ids=position_ids)
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [rows, new, 1, head_dim]
        half = self.head_dim // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        mask = self._mask(attention_mask, new, columns)
        q_width = self.heads * self.head_dim
        qk_width = q_width + self.kv_heads * self.head_dim
        for index, layer in enumerate(self.layers):
            residual = hidden
            normed = _rms_norm(layer.input_layernorm, hidden)
            attention = layer.self_attn
            qkv = _fused_product(attention, "qkv_proj", normed, groups)
            if qkv is not None:
                query_key = qkv[..., :qk_width]
                value = qkv[..., qk_width:]
            else:
                query_key = torch.cat((attention.q_proj(normed), attention.k_proj(normed)), dim=-1)
                value = attention.v_proj(normed)
            rotated = query_key.view(rows, new, -1, self.head_dim)
            rotated = rotated * cos + rotated.roll(half, dims=-1) * sin
            query = rotated[:, :, : self.heads].transpose(1, 2)
            key = rotated[:, :, self.heads :].transpose(1, 2)
            value = value.view(rows, new, self.kv_heads, self.head_dim).transpose(1, 2)
            # the engine's caches hold SlabLayer (full-attention) layers only
            layer_cache = cache.layers[index]
            keys, values = layer_cache.update(key.float(), value.float())  # type: ignore[union-attr]
            output = F.scaled_dot_product_attention(
                query.float(), keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=True
            ).to(dtype)
            output = output.transpose(1, 2).reshape(rows, new, q_width)
            hidden = residual + attention.o_proj(output)
            residual = hidden
            normed = _rms_norm(layer.post_attention_layernorm, hidden)
            mlp = layer.mlp
            gate_up = _fused_product(mlp, "gate_up_proj", normed, groups)
            if gate_up is not None:
                width = gate_up.shape[-1] // 2
                gated = mlp.act_fn(gate_up[..., :width]) * gate_up[..., width:]
            else:
                gated = mlp.act_fn(mlp.gate_proj(normed)) * mlp.up_proj(normed)
            hidden = residual + mlp.down_proj(gated)
        last = _rms_norm(self.inner.norm, hidden[:, -1:, :])
        logits: torch.Tensor = self.model.lm_head(last)
        return logits[:, -1, :]

    def _mask(self, attention_mask: torch.Tensor, new: int, columns: int) -> torch.Tensor | None:
        """What keeps each new token to the real tokens at or before it: ``None`` when
        nothing needs hiding (one new token, no padding), else ``[rows, 1, new, columns]``,
        boolean (float32) or an additive bias (bfloat16). A padding slot among the new
        tokens sees itself, so no row of the softmax is empty."""
        real = attention_mask.bool()
        if new == 1:
            if bool(real.all()):
                return None
            allowed = real[:, None, None, :]
        else:
            column = torch.arange(columns)
            own = torch.arange(columns - new, columns)[:, None]
            allowed = (column[None, :] <= own)[None, None] & real[:, None, None, :]
            allowed = allowed | (column[None, :] == own)[None, None]
        return allowed

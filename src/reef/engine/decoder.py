"""A lean forward pass for Llama-family decoders: the engine's prefill and decode steps.

Hugging Face's model forward is written for every case (training, generation, many
attention kernels, hooks); a decode step of SmolLM2-135M through it spends about a third
of its time outside the matrix products: a 4-D mask rebuilt each step, ~40 small ops per
layer, and, in bfloat16, torch's flash-attention kernel, which takes ~0.75 ms per layer
for 8 rows of one query each (22 of a 56 ms step on an AMD EPYC). This pass runs the same
layers' own modules (so PEFT's LoRA layers, the packed and int8 projections all apply)
with fewer ops around them:

- the padding mask is built once per step, and left out when no row has padding;
- rotary embeddings are applied to queries and keys together, with ``roll`` in place of
  ``rotate_half``'s slice-negate-concatenate (the same products: negation is exact);
- attention is torch's scaled-dot-product kernel in float32 whatever the weights' dtype:
  keys and values are cached in float32 (in bfloat16 the kernel is several times slower
  on a CPU: ~0.75 ms against ~0.29 ms per layer for 8 rows; the cache is then as large as
  a float32 model's);
- only the last position reaches the final norm and the output head.

Measured on SmolLM2-135M (and checked on the tiny model: tests/engine/test_decoder.py): float32
logits are those of the Hugging Face forward to ~1e-4 (the attention kernel gets an
explicit mask where Hugging Face's may use its causal flag), with the same greedy tokens;
bfloat16 ones differ more (attention is float32 here, bfloat16 there) and are checked
against float32 as every precision is (docs/engine.md#precision).

:func:`supports` says which models take this pass; any other model runs Hugging Face's.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
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
    ) -> torch.Tensor:
        """Run ``input_ids`` (``[rows, new]``) after what ``cache`` holds, writing their
        keys and values into it; return the logits of each row's last position
        (``[rows, vocab]``, the model's dtype). ``attention_mask`` (``[rows, columns]``,
        1 for a real token) covers the cached columns and the new ones; ``position_ids``
        (``[rows, new]``) are each new token's position in its own sequence."""
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
        for index, layer in enumerate(self.layers):
            residual = hidden
            normed = _rms_norm(layer.input_layernorm, hidden)
            attention = layer.self_attn
            query = attention.q_proj(normed)
            key = attention.k_proj(normed)
            value = attention.v_proj(normed)
            rotated = torch.cat((query, key), dim=-1).view(rows, new, -1, self.head_dim)
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

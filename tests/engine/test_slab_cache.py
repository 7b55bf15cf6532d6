"""The engine's KV cache layer (``SlabLayer``) holds exactly what Hugging Face's
``DynamicLayer`` holds, through a prefill, decode steps past several growths of its
slab, and rows cut and joined in between."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from reef.engine.batch import SLAB_GROWTH, SlabLayer


def _columns(rows: int, width: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    shape = (rows, 3, width, 8)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def test_a_slab_layer_holds_what_a_dynamic_layer_holds() -> None:
    generator = torch.Generator().manual_seed(0)
    slab, plain = SlabLayer(), DynamicLayer()
    keys, values = _columns(4, 37, generator)  # the prompt
    for layer in (slab, plain):
        layer.update(keys, values)
    grown = 0
    for step in range(3 * SLAB_GROWTH):
        if step == 50:  # rows 1 and 3 finish: keep 0 and 2
            index = torch.tensor([0, 2])
            slab.assign(slab.keys[index], slab.values[index])
            plain.keys, plain.values = plain.keys[index], plain.values[index]
        if step == 90:  # two rows join (already padded to the same width)
            more_keys, more_values = _columns(2, plain.keys.shape[-2], generator)
            slab.assign(torch.cat([slab.keys, more_keys]), torch.cat([slab.values, more_values]))
            plain.keys = torch.cat([plain.keys, more_keys])
            plain.values = torch.cat([plain.values, more_values])
        before = slab._keys
        keys, values = _columns(plain.keys.shape[0], 1, generator)
        got = slab.update(keys, values)
        want = plain.update(keys, values)
        grown += slab._keys is not before
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert slab.get_seq_length() == plain.get_seq_length()
    # a step writes in place: the slab was replaced only when full (or rows changed)
    assert 2 <= grown <= 5

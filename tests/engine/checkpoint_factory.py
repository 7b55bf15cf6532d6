"""Checkpoints of tiny-random for the tests: full weights saved as safetensors, rigged so
greedy decoding says one letter forever (every position's hidden state is the same
vector, and only that letter's output row sees it)."""

from __future__ import annotations

from pathlib import Path

import torch

from reef.engine.models import load_model


def make_letter_checkpoint(directory: Path, letter: str) -> Path:
    """A tiny-random checkpoint at ``directory`` that answers ``letter`` repeated."""
    loaded = load_model("tiny-random", directory.parent)
    model, tokenizer = loaded.model, loaded.tokenizer
    (token,) = tokenizer.encode(letter, add_special_tokens=False)
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        model.lm_head.weight[token] = 1.0
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def make_noisy_checkpoint(directory: Path, seed: int) -> Path:
    """A tiny-random checkpoint at ``directory``: every weight moved by seeded noise, so
    it answers otherwise than tiny-random does."""
    loaded = load_model("tiny-random", directory.parent)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in loaded.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * 0.5)
    loaded.model.save_pretrained(str(directory), safe_serialization=True)
    loaded.tokenizer.save_pretrained(str(directory))
    return directory

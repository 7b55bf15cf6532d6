"""Adapters for tests whose effect is obvious: each makes the tiny model say one letter.

The adapter is a LoRA on the input embedding that adds one huge vector to every
token's embedding, pointing along the output-embedding row of the chosen letter. The
residual stream is then dominated by that vector at every position, so greedy
decoding emits the letter forever, whatever the prompt: "aaaa…" or "bbbb…".
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model

from reef.engine.tiny import build_tiny_model, build_tiny_tokenizer

# PEFT 0.21 reads a deprecated transformers property while wrapping a model.
PEFT_WRAP_WARNING = "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"


def make_letter_adapter(directory: Path, letter: str) -> Path:
    """Write a safetensors LoRA adapter for ``tiny-random`` into ``directory``."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing. is deprecated", category=FutureWarning
        )
        peft_model = get_peft_model(
            model, LoraConfig(r=2, lora_alpha=2, target_modules=["embed_tokens"])
        )
    token_id = tokenizer.convert_tokens_to_ids(letter)
    embedding = peft_model.base_model.model.model.embed_tokens
    direction = model.lm_head.weight[token_id].detach()
    with torch.no_grad():
        lora_a = embedding.lora_embedding_A["default"]
        lora_b = embedding.lora_embedding_B["default"]
        lora_a.zero_()
        lora_a[0, :] = 1.0
        lora_b.zero_()
        lora_b[:, 0] = direction / direction.norm() * 1000.0
    peft_model.save_pretrained(directory, save_embedding_layers=False)
    return directory


def make_random_adapter(
    directory: Path, seed: int, targets: tuple[str, ...] = ("q_proj", "v_proj", "down_proj")
) -> Path:
    """A LoRA adapter for ``tiny-random`` (or a checkpoint of it) at ``directory``, with
    seeded random weights on the projections ``targets`` (a strong delta)."""
    torch.manual_seed(seed)
    model = build_tiny_model(build_tiny_tokenizer())
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing. is deprecated", category=FutureWarning
        )
        peft_model = get_peft_model(
            model,
            LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)),
        )
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    peft_model.save_pretrained(directory, save_embedding_layers=False)
    return directory

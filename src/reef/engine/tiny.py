"""``tiny-random``: a tiny Llama with random weights and a byte-level tokenizer.

Built in-process in milliseconds, identical on every build (fixed seed), nothing
downloaded. Its outputs are noise, but every code path (chat template, batching,
adapters, logprobs) runs exactly as it does on a real model.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TINY_SEED = 1234

# ChatML, as SmolLM2 and Qwen use it. Like SmolLM2's it takes no ``tools``, so the tiny
# model gets tools through the engine's default tool prompt, as the default model does.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] or '' }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: one token per byte plus the ChatML special tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token="<|im_start|>",  # noqa: S106 (tokenizer tokens, not passwords)
        eos_token="<|im_end|>",  # noqa: S106 (tokenizer tokens, not passwords)
        pad_token="<|endoftext|>",  # noqa: S106 (tokenizer tokens, not passwords)
        unk_token="<|endoftext|>",  # noqa: S106 (tokenizer tokens, not passwords)
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast, dtype: torch.dtype = torch.float32
) -> LlamaForCausalLM:
    """A 2-layer Llama sized to ``tokenizer``, with weights fixed by :data:`TINY_SEED`."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    model.to(dtype=dtype)  # type: ignore[call-arg]  # nn.Module.to is typed through a wrapper
    return model

"""Choosing the next token of each row: greedy, temperature, top-p, seeds, logprobs."""

from __future__ import annotations

import random

import torch

from reef.engine.sequences import SamplingParams, TokenLogprob


def row_generator(params: SamplingParams, index: int) -> torch.Generator | None:
    """The random stream of one sequence: ``seed + index`` when seeded, so a seeded
    request gives the same output whatever else shares its batch. None when greedy."""
    if params.temperature == 0:
        return None
    seed = params.seed + index if params.seed is not None else random.getrandbits(63)
    return torch.Generator().manual_seed(seed)


def choose_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[tuple[int, TokenLogprob | None]]:
    """Pick one token per row of ``logits`` (``[rows, vocab]``, float32)."""
    logprobs = torch.log_softmax(logits, dim=-1) if any(p.logprobs for p in params) else None
    greedy = logits.argmax(dim=-1).tolist()
    chosen: list[tuple[int, TokenLogprob | None]] = []
    for row, (param, generator) in enumerate(zip(params, generators, strict=True)):
        token = int(greedy[row]) if generator is None else _sample(logits[row], param, generator)
        entry = None
        if logprobs is not None and param.logprobs:
            entry = _logprob_entry(logprobs[row], token, param.top_logprobs)
        chosen.append((token, entry))
    return chosen


def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p >= 1.0:
        return int(torch.multinomial(probs, 1, generator=generator))
    sorted_probs, order = probs.sort(descending=True)
    # Keep the smallest prefix whose mass reaches top_p (always at least one token).
    outside = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    return int(order[torch.multinomial(sorted_probs, 1, generator=generator)])


def _logprob_entry(logprobs: torch.Tensor, token: int, top: int) -> TokenLogprob:
    alternatives: tuple[tuple[int, float], ...] = ()
    if top:
        values, indices = logprobs.topk(top)
        alternatives = tuple(
            (int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)
        )
    return TokenLogprob(token, float(logprobs[token]), alternatives)

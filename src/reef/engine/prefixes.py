"""Prompt prefixes already prefilled: their keys and values, reused by later prompts.

Requests to one scenario start alike: the chat template, the harness's system prompt,
its few-shot demos. The cache keeps the keys and values of every prompt prefilled, in
blocks of ``BLOCK`` tokens, keyed by the weights' adapter and the exact tokens from the
prompt's start to the block's end (a block's key is its parent's id and its own tokens,
so a match is exact, never a hash collision). A later prompt on the same adapter
prefills only what follows its longest cached run of whole blocks (always at least its
last token: the first sampled token needs its logits). Blocks are evicted least recently
used first, within a byte budget. Results are those of prefilling the whole prompt up to
float rounding (the same sums in another order), as with vLLM's prefix caching.

The cache lives with one decode batch (one set of base weights); keys name adapter
versions, which are never reused, so a block can only serve the weights it was
computed with. Used on the scheduler's worker thread only.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

BLOCK = 8
"""Tokens per cached block: a prompt reuses whole blocks only. On the quickstart's
traffic (``bench/prefix_cache.py``, AMD EPYC, 2 cores) 8 left 21 tokens per request to
prefill where 16 left 27.5 (up to a block of the shared prefix is prefilled again), and
served 2.3x against 1.9x the requests/s without the cache."""

DEFAULT_BUDGET_BYTES = 256 * 2**20
"""Bytes of keys and values the cache may hold (``upstreams.<name>.prefix_cache_mb``)."""


@dataclass(frozen=True)
class Block:
    """One block's keys and values per layer (``[heads, BLOCK, head_dim]`` each)."""

    ident: int
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    nbytes: int


@dataclass(frozen=True)
class Match:
    """The cached blocks that start a prompt, in order; ``tokens`` they cover."""

    blocks: tuple[Block, ...]

    @property
    def tokens(self) -> int:
        return len(self.blocks) * BLOCK

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s keys and values of the whole match, ``[heads, tokens, dim]``."""
        keys = torch.cat([block.keys[index] for block in self.blocks], dim=1)
        values = torch.cat([block.values[index] for block in self.blocks], dim=1)
        return keys, values


class PrefixCache:
    """Blocks of prefilled prompts, least recently used evicted past ``budget_bytes``
    (0: the cache is off)."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self._blocks: OrderedDict[tuple[str, int, tuple[int, ...]], Block] = OrderedDict()
        self._ids = itertools.count(1)
        self.bytes = 0
        self.hits = 0
        self.hit_tokens = 0
        self.prompt_tokens = 0

    def stats(self) -> dict[str, int]:
        """Blocks and bytes held, prompts that reused a prefix, tokens reused and
        prompt tokens seen."""
        return {
            "blocks": len(self._blocks),
            "bytes": self.bytes,
            "hits": self.hits,
            "hit_tokens": self.hit_tokens,
            "prompt_tokens": self.prompt_tokens,
        }

    def match(self, adapter: str, prompt: Sequence[int]) -> Match:
        """The longest run of cached blocks that starts ``prompt`` on ``adapter`` and
        leaves at least its last token to run; touched as recently used."""
        found: list[Block] = []
        parent = 0
        if self.budget_bytes > 0:
            for start in range(0, len(prompt) - 1 - BLOCK + 1, BLOCK):
                key = (adapter, parent, tuple(prompt[start : start + BLOCK]))
                block = self._blocks.get(key)
                if block is None:
                    break
                self._blocks.move_to_end(key)
                found.append(block)
                parent = block.ident
        return Match(tuple(found))

    def count(self, prompt_tokens: int, match: Match) -> None:
        """Record one prompt prefilled and what it reused."""
        self.prompt_tokens += prompt_tokens
        if match.blocks:
            self.hits += 1
            self.hit_tokens += match.tokens

    def store(
        self,
        adapter: str,
        prompt: Sequence[int],
        match: Match,
        layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
        first_column: int,
    ) -> None:
        """Keep the whole blocks of ``prompt`` after ``match``: ``layers`` hold each
        layer's keys and values for one row (``[heads, columns, dim]``), where the
        prompt's token ``match.tokens`` sits at column ``first_column`` and the rest
        follow it. Blocks are copied (the row's cache is not held)."""
        if self.budget_bytes <= 0:
            return
        parent = match.blocks[-1].ident if match.blocks else 0
        for start in range(match.tokens, len(prompt) - BLOCK + 1, BLOCK):
            key = (adapter, parent, tuple(prompt[start : start + BLOCK]))
            block = self._blocks.get(key)
            if block is None:
                column = first_column + start - match.tokens
                keys = tuple(k[:, column : column + BLOCK].clone() for k, _ in layers)
                values = tuple(v[:, column : column + BLOCK].clone() for _, v in layers)
                size = sum(t.nbytes for t in keys) + sum(t.nbytes for t in values)
                block = Block(next(self._ids), keys, values, size)
                self._blocks[key] = block
                self.bytes += size
            else:
                self._blocks.move_to_end(key)
            parent = block.ident
        self._evict()

    def forget(self, adapter: str) -> None:
        """Drop every block computed under ``adapter`` (its weights are gone)."""
        for key in [key for key in self._blocks if key[0] == adapter]:
            self.bytes -= self._blocks.pop(key).nbytes

    def _evict(self) -> None:
        while self.bytes > self.budget_bytes and self._blocks:
            _, block = self._blocks.popitem(last=False)
            self.bytes -= block.nbytes

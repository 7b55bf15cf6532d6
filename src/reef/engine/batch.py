"""The running batch: one KV cache shared by every active sequence.

Continuous batching on a plain Hugging Face model: new prompts are prefilled on
their own, then their cache is left-padded to the running cache's length (or the
other way round) and concatenated along the batch dimension. Finished rows are cut
out, and columns that are padding in every remaining row are trimmed. Rows carry
their own positions and attention masks, so padding never changes a result.

Each layer's keys and values live in a slab with room to grow (``SlabLayer``): a decode
step writes its one new column in place, where Hugging Face's ``DynamicLayer``
concatenates, copying the whole cache once per layer and step (the slab is worth about 7%
at 8 rows in bfloat16: docs/benchmarks.md, engine vs vLLM). Joining, cutting and
trimming rows, which happen when a request starts or ends rather than on every step,
copy into a new slab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer

from reef.engine.adapters import AdapterModel
from reef.engine.prefixes import Match, PrefixCache
from reef.engine.sequences import Sequence

SLAB_GROWTH = 128
"""Columns a slab gains when it is full (and has to spare when it is made): one copy of
the cache per 128 decode steps instead of one per step."""


class SlabLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A ``DynamicLayer`` whose ``keys`` and ``values`` are views of the first
    ``length`` columns of preallocated ``[rows, heads, capacity, head_dim]`` slabs."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new columns after the cached ones; return every column so far."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, added = self.length, key_states.shape[-2]
        keys, values = self._keys, self._values
        if keys is None or values is None or start + added > keys.shape[-2]:
            if keys is not None and values is not None and start:
                self.assign(keys[:, :, :start], values[:, :, :start], spare=added + SLAB_GROWTH)
            else:
                self._make(key_states, value_states, added + SLAB_GROWTH)
            keys, values = self._keys, self._values
            assert keys is not None and values is not None
        keys[:, :, start : start + added] = key_states
        values[:, :, start : start + added] = value_states
        return self._expose(start + added)

    def assign(self, keys: torch.Tensor, values: torch.Tensor, spare: int = SLAB_GROWTH) -> None:
        """Hold exactly ``keys`` and ``values`` (copied into new slabs, ``spare`` free
        columns after them)."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        self._make(keys, values, spare)
        assert self._keys is not None and self._values is not None
        width = keys.shape[-2]
        self._keys[:, :, :width] = keys
        self._values[:, :, :width] = values
        self._expose(width)
        self.is_initialized = True

    def _make(self, keys: torch.Tensor, values: torch.Tensor, spare: int) -> None:
        rows, heads, width, _ = keys.shape
        capacity = width + spare
        self._keys = keys.new_empty((rows, heads, capacity, keys.shape[-1]))
        self._values = values.new_empty((rows, values.shape[1], capacity, values.shape[-1]))

    def _expose(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._keys is not None and self._values is not None
        self.length = length
        keys, values = self._keys[:, :, :length], self._values[:, :, :length]
        self.keys, self.values = keys, values
        return keys, values


def new_cache(config: PretrainedConfig) -> DynamicCache:
    """A cache of ``SlabLayer`` layers (those of a model with only full-attention layers)."""
    cache = DynamicCache(config=config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise TypeError("continuous batching needs a model whose layers all attend to everything")
    cache.layers = [SlabLayer() for _ in cache.layers]
    return cache


def _layers(cache: DynamicCache) -> list[tuple[SlabLayer, torch.Tensor, torch.Tensor]]:
    """Each layer with its keys and values (``[rows, heads, columns, head_dim]``)."""
    found: list[tuple[SlabLayer, torch.Tensor, torch.Tensor]] = []
    for layer in cache.layers:
        if not isinstance(layer, SlabLayer):
            raise TypeError("continuous batching needs a cache made by new_cache()")
        if layer.keys is None or layer.values is None:
            raise TypeError("cache layer was never filled")
        found.append((layer, layer.keys, layer.values))
    return found


class DecodeBatch:
    """Active sequences, their KV cache, masks, positions and next input tokens."""

    def __init__(
        self, runner: AdapterModel, config: PretrainedConfig, prefixes: PrefixCache | None = None
    ) -> None:
        self.runner = runner
        self.config = config
        self.prefixes = prefixes if prefixes is not None else PrefixCache(0)
        self.rows: list[Sequence] = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.positions = torch.zeros(0, dtype=torch.long)
        self.next_tokens = torch.zeros(0, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rows)

    def prefill(self, rows: list[Sequence]) -> torch.Tensor:
        """Run the prompts of ``rows``, add them to the batch; return their logits
        (``[len(rows), vocab]``) for sampling the first token, in the order the rows
        joined the batch (rows that reuse the same cached prefix join together)."""
        groups: dict[int, list[tuple[Sequence, Match]]] = {}
        for row in rows:
            match = self.prefixes.match(row.job.adapter_key, row.job.prompt_ids)
            self.prefixes.count(len(row.job.prompt_ids), match)
            groups.setdefault(match.tokens, []).append((row, match))
        logits = [self._prefill(cached, group) for cached, group in groups.items()]
        return logits[0] if len(logits) == 1 else torch.cat(logits)

    def _prefill(self, cached: int, group: list[tuple[Sequence, Match]]) -> torch.Tensor:
        """Prefill rows whose first ``cached`` prompt tokens are in the prefix cache:
        their keys and values fill the first ``cached`` columns, each row's rest follows
        left-padded (``[prefix | padding | rest]``; masks and positions keep padding out
        of every result)."""
        rows = [row for row, _ in group]
        rests = [row.job.prompt_ids[cached:] for row in rows]
        width = max(len(rest) for rest in rests)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), cached + width), dtype=torch.long)
        mask[:, :cached] = 1
        for i, rest in enumerate(rests):
            input_ids[i, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            positions[i, width - len(rest) :] = torch.arange(cached, cached + len(rest))
            mask[i, cached + width - len(rest) :] = 1
        cache = new_cache(self.config)
        if cached:
            self._fill(cache, [match for _, match in group])
        logits = self.runner.forward_logits(
            input_ids, mask, positions, cache, [row.job.adapter_key for row in rows]
        )
        layers = _layers(cache)
        for i, ((row, match), rest) in enumerate(zip(group, rests, strict=True)):
            self.prefixes.store(
                row.job.adapter_key,
                row.job.prompt_ids,
                match,
                [(keys[i], values[i]) for _, keys, values in layers],
                cached + width - len(rest),
            )
        self._merge(rows, cache, mask, positions[:, -1])
        return logits

    @staticmethod
    def _fill(cache: DynamicCache, matches: list[Match]) -> None:
        """Put each row's cached prefix in ``cache`` (rows with the same blocks share one
        concatenation)."""
        chains = [tuple(block.ident for block in match.blocks) for match in matches]
        distinct = dict(zip(chains, matches, strict=True))
        for index, layer in enumerate(cache.layers):
            assert isinstance(layer, SlabLayer)
            joined = {chain: match.layer(index) for chain, match in distinct.items()}
            keys = torch.stack([joined[chain][0] for chain in chains])
            values = torch.stack([joined[chain][1] for chain in chains])
            layer.assign(keys, values)

    def step(self) -> torch.Tensor:
        """Feed every row its last sampled token; return next-token logits ``[rows, vocab]``."""
        self.mask = torch.cat([self.mask, torch.ones((len(self.rows), 1), dtype=torch.long)], 1)
        self.positions = self.positions + 1
        return self.runner.forward_logits(
            self.next_tokens[:, None],
            self.mask,
            self.positions[:, None],
            self.cache,
            [row.job.adapter_key for row in self.rows],
        )

    def set_next_tokens(self, start: int, tokens: torch.Tensor) -> None:
        """Record sampled tokens for rows ``start …`` (the input of the next step)."""
        self.next_tokens[start : start + len(tokens)] = tokens

    def keep(self, keep: list[int]) -> None:
        """Keep only the rows at indices ``keep`` (in order); trim all-padding columns."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.cache = [], None
            self.mask = torch.zeros((0, 0), dtype=torch.long)
            self.positions = self.next_tokens = torch.zeros(0, dtype=torch.long)
            return
        index = torch.tensor(keep, dtype=torch.long)
        self.rows = [self.rows[i] for i in keep]
        self.mask = self.mask[index]
        self.positions = self.positions[index]
        self.next_tokens = self.next_tokens[index]
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        self.mask = self.mask[:, first:]
        assert self.cache is not None
        for layer, keys, values in _layers(self.cache):
            layer.assign(keys[index, :, first:], values[index, :, first:])

    def _merge(
        self, rows: list[Sequence], cache: DynamicCache, mask: torch.Tensor, last: torch.Tensor
    ) -> None:
        if self.cache is None:
            self.rows, self.cache, self.mask, self.positions = list(rows), cache, mask, last
            self.next_tokens = torch.zeros(len(rows), dtype=torch.long)
            return
        width = max(self.mask.shape[1], mask.shape[1])
        self.mask = self._pad(self.cache, self.mask, width)
        mask = self._pad(cache, mask, width)
        for (ours, keys, values), (_, more_keys, more_values) in zip(
            _layers(self.cache), _layers(cache), strict=True
        ):
            ours.assign(torch.cat([keys, more_keys]), torch.cat([values, more_values]))
        self.rows.extend(rows)
        self.mask = torch.cat([self.mask, mask])
        self.positions = torch.cat([self.positions, last])
        self.next_tokens = torch.cat([self.next_tokens, torch.zeros(len(rows), dtype=torch.long)])

    @staticmethod
    def _pad(cache: DynamicCache, mask: torch.Tensor, width: int) -> torch.Tensor:
        missing = width - mask.shape[1]
        if missing == 0:
            return mask
        for layer, keys, values in _layers(cache):
            layer.assign(F.pad(keys, (0, 0, missing, 0)), F.pad(values, (0, 0, missing, 0)))
        return F.pad(mask, (missing, 0))

"""The engine's prompt-prefix cache (``reef.engine.prefixes``): prompts that start alike
prefill only what follows their cached blocks, and decode exactly what they decode
without the cache, on the base weights and under adapters, as rows join a running batch."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
import torch

from reef.engine.adapters import AdapterModel
from reef.engine.batch import DecodeBatch
from reef.engine.models import LoadedModel, load_model
from reef.engine.prefixes import BLOCK, PrefixCache
from reef.engine.sequences import GenerationJob, SamplingParams, Sequence
from tests.engine.conftest import TINY, Admin
from tests.engine.lora_factory import PEFT_WRAP_WARNING, make_random_adapter

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

SHARED = list(range(30, 30 + 3 * BLOCK + 5))
"""A prefix of three whole blocks and a bit: what a scenario's requests share."""


def _layers(tokens: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One row's keys and values for ``tokens`` columns: column ``c`` holds ``c``."""
    column = torch.arange(tokens, dtype=torch.float32)[None, :, None].expand(3, tokens, 4)
    return [(column.clone(), -column.clone()) for _ in range(layers)]


def test_whole_blocks_are_reused_and_the_last_token_always_runs() -> None:
    cache = PrefixCache()
    prompt = [*SHARED, 7, 8]
    cache.store("base", prompt, cache.match("base", prompt), _layers(len(prompt)), 0)
    assert cache.stats()["blocks"] == len(prompt) // BLOCK
    other = [*SHARED, 9]
    match = cache.match("base", other)
    assert match.tokens == 3 * BLOCK
    keys, values = match.layer(1)
    assert torch.equal(keys[0, :, 0], torch.arange(3 * BLOCK, dtype=torch.float32))
    assert torch.equal(values, -keys)
    # a prompt that is exactly cached blocks still runs its last token itself
    assert cache.match("base", SHARED[: 2 * BLOCK]).tokens == BLOCK
    # a block is found only after the same tokens from the start, on the same adapter
    assert cache.match("base", [1, *SHARED]).tokens == 0
    assert cache.match("reef-1", other).tokens == 0
    cache.forget("base")
    assert cache.match("base", other).tokens == 0
    assert cache.stats()["bytes"] == 0


def test_least_recently_used_blocks_go_past_the_budget() -> None:
    one_block = sum(k[:, :BLOCK].nbytes + v[:, :BLOCK].nbytes for k, v in _layers(BLOCK))
    cache = PrefixCache(budget_bytes=2 * one_block)
    first, second = list(range(2 * BLOCK + 1)), list(range(100, 100 + 2 * BLOCK + 1))
    cache.store("base", first, cache.match("base", first), _layers(len(first)), 0)
    assert cache.match("base", first).tokens == 2 * BLOCK
    cache.store("base", second, cache.match("base", second), _layers(len(second)), 0)
    assert cache.stats()["bytes"] <= 2 * one_block
    assert cache.match("base", second).tokens == 2 * BLOCK
    assert cache.match("base", first).tokens == 0
    assert PrefixCache(budget_bytes=0).match("base", second).tokens == 0


def _decode(
    loaded: LoadedModel, runner: AdapterModel, budget: int, waves: list[list[tuple[list[int], str]]]
) -> tuple[dict[int, list[int]], dict[str, int]]:
    """Greedy-decode ``waves`` of (prompt, adapter) rows, each wave joining the running
    batch after two steps of the one before; the tokens per row, and the cache's stats."""
    batch = DecodeBatch(runner, loaded.model.config, PrefixCache(budget))
    tokens: dict[int, list[int]] = {}
    number = 0
    with torch.inference_mode():
        for wave in waves:
            rows = []
            for prompt, adapter in wave:
                row = Sequence(_Job(prompt, adapter), number, ())
                tokens[number] = []
                number += 1
                rows.append(row)
            start = len(batch)
            logits = batch.prefill(rows)
            chosen = logits.argmax(-1)
            batch.set_next_tokens(start, chosen)
            for row, token in zip(batch.rows[start:], chosen, strict=True):
                tokens[row.index].append(int(token))
            for _ in range(2):
                chosen = batch.step().argmax(-1)
                batch.set_next_tokens(0, chosen)
                for row, token in zip(batch.rows, chosen, strict=True):
                    tokens[row.index].append(int(token))
    return tokens, batch.prefixes.stats()


class _Job(GenerationJob):
    """A greedy job on the adapter named ``adapter`` (``__base__``: none)."""

    def __init__(self, prompt: list[int], adapter: str) -> None:
        super().__init__(
            tuple(prompt), SamplingParams(max_tokens=8, temperature=0), 1, None, print, print
        )
        self._adapter = adapter

    @property
    def adapter_key(self) -> str:
        return self._adapter


def test_rows_decode_as_without_the_cache_on_base_and_adapter_weights(tmp_path: Path) -> None:
    loaded = load_model(TINY, tmp_path)
    runner = AdapterModel(loaded.model)
    runner.load("reef-1", make_random_adapter(tmp_path / "adapter", seed=5))
    base, tuned = "__base__", "reef-1"
    waves = [
        [([*SHARED, 101, 102], base)],
        # joins the running row; two reuse its blocks, one runs under the adapter
        [([*SHARED, 103], base), ([*SHARED, 104, 105, 106, 107], base), ([*SHARED, 108], tuned)],
        # the adapter's blocks now serve the adapter (and never the base)
        [([*SHARED, 109, 110], tuned), ([*SHARED[:20], 111], base)],
    ]
    plain, off = _decode(loaded, runner, 0, waves)
    cached, stats = _decode(loaded, runner, 2**26, waves)
    assert off["hits"] == 0
    assert cached == plain
    # rows 1 and 2 (base, after row 0), 4 (adapter, after row 3), 5 (its first 20
    # tokens' whole blocks): 4 hits
    assert stats["hits"] == 4
    assert stats["hit_tokens"] == 3 * (3 * BLOCK) + (20 // BLOCK) * BLOCK
    # the adapter changes what the prompt's keys and values are: its rows differ
    assert plain[3] != plain[1]


async def test_a_repeated_system_prompt_is_prefilled_once(
    client: openai.AsyncOpenAI, admin: Admin
) -> None:
    system = {"role": "system", "content": "You sort support tickets. " * 12}
    answers = []
    for ticket in ("My card was charged twice", "My card was charged twice", "Where is it?"):
        response = await client.chat.completions.create(
            model=TINY,
            messages=[system, {"role": "user", "content": ticket}],
            max_tokens=6,
            temperature=0,
        )
        answers.append(response.choices[0].message.content)
    assert answers[0] == answers[1]
    status, text = await admin.get("/../health")
    prefixes = json.loads(text)["prefix_cache"]
    assert status == 200 and prefixes["hits"] == 2
    assert prefixes["hit_tokens"] >= 2 * BLOCK * (len(system["content"]) // 4 // BLOCK)

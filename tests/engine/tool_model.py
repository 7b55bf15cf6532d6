"""A tiny model that calls tools on cue: tiny-random fine-tuned in-process until greedy
decoding reproduces fixed replies to fixed prompts.

The prompts go through the engine's own encoding (default tool prompt, ``tool_choice``
prefill), so what the model learnt is exactly what a request sends; the replies are in
the format of :mod:`reef.core.chat_format`. It is a real model on the real serving path,
which makes tool-call answers deterministic without a scripted stand-in. Training takes
a few seconds on one CPU thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from reef.core.chat_format import ToolChoice
from reef.engine.runtime import Engine

Lesson = tuple[list[dict[str, Any]], list[dict[str, Any]], ToolChoice, str]
"""messages, tools, tool_choice, and the reply the model must give (prefill included)."""

MAX_STEPS = 400
TARGET_LOSS = 0.05


def teach_replies(engine: Engine, lessons: Sequence[Lesson]) -> None:
    """Fine-tune ``engine``'s model (before it starts) until every lesson's reply is
    what it generates. Raises ``AssertionError`` when it does not learn in time."""
    tokenizer = engine.loaded.tokenizer
    examples: list[tuple[list[int], list[int]]] = []
    for messages, tools, choice, reply in lessons:
        prompt, prefill = engine.encode_tool_chat(messages, tools, choice)
        assert reply.startswith(prefill), (reply, prefill)
        rest = tokenizer.encode(reply[len(prefill) :], add_special_tokens=False)
        examples.append((prompt, [*rest, tokenizer.eos_token_id]))
    model = engine.loaded.model
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a small shared machine more threads only wait on each other
    try:
        _train(model, optimizer, examples)
    finally:
        torch.set_num_threads(threads)
    model.eval()  # type: ignore[no-untyped-call]


def _train(
    model: Any, optimizer: torch.optim.Optimizer, examples: list[tuple[list[int], list[int]]]
) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for _ in range(MAX_STEPS):
            results = [_loss(model, prompt, reply) for prompt, reply in examples]
            total = torch.stack([loss for loss, _ in results]).sum()
            # a low mean loss alone can leave one token of a long reply second best (a
            # 175-token reply at mean 0.046 kept one at 1.0, and greedy decoding left it)
            if total.item() < TARGET_LOSS and all(learnt for _, learnt in results):
                break
            total.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            optimizer.zero_grad()
        else:
            raise AssertionError(f"the tiny model did not learn its replies (loss {total})")


def _loss(model: Any, prompt: list[int], reply: list[int]) -> tuple[torch.Tensor, bool]:
    """The reply's loss, and whether every token of it is the model's first choice."""
    ids = torch.tensor([prompt + reply])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100  # learn the reply only
    output = model(input_ids=ids, labels=labels)
    chosen = output.logits[0, len(prompt) - 1 : -1].argmax(-1)
    loss: torch.Tensor = output.loss
    return loss, bool(torch.equal(chosen, ids[0, len(prompt) :]))

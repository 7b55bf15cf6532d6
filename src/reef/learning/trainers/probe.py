"""What an SFT run learned, measured so that the served model can be held to it.

After training, for a fixed sample of the examples it trained on, the trainer checks
whether greedy decoding of each prompt gives the target. The measure is teacher-forced:
one forward pass over prompt and target, matched when the arg-max at every labelled
position, up to and including the first end-of-turn token, is the target's token. That
is what greedy decoding of the same prompt with the same weights produces (each greedy
step conditions on the tokens before it, which are then the target's), for one forward
pass instead of one per token: the cheapest measure that is faithful to a served,
greedy answer. Tokens after the end of turn (a template's trailing newline) are left
out: generation stops before them.

The sample holds text replies only (no tools offered, no calls or results in the
conversation: their served form is a parsed tool call, not text) whose whole sequence
fits ``max_seq_len`` (a cut prompt is not what the gateway sends). It is drawn by its own
seeded generator, so the training run's data order is the same with or without it.
Imports torch: runs in the training child.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from reef.learning.trainers.masking import IGNORE_INDEX
from reef.learning.trainers.spec import SFTExample


def probe_indices(
    examples: Sequence[SFTExample],
    trained: Sequence[int],
    size: int,
    seed: int,
    fits: Callable[[SFTExample], bool],
) -> list[int]:
    """Up to ``size`` of the ``trained`` example indices to probe, in increasing order:
    text replies that ``fits`` (their whole sequence is within ``max_seq_len``), drawn by
    a generator seeded with ``seed`` (module docstring)."""
    order = sorted(trained)
    random.Random(f"probe:{seed}").shuffle(order)  # noqa: S311 (seeded, not secret)
    chosen: list[int] = []
    for index in order:
        if len(chosen) >= size:
            break
        example = examples[index]
        with_tools = bool(example.tools) or any(
            m.get("tool_calls") or m.get("role") == "tool" for m in example.messages
        )
        if not with_tools and fits(example):
            chosen.append(index)
    return sorted(chosen)


def greedy_matches(
    model: torch.nn.Module,
    rows: Sequence[tuple[list[int], list[int]]],
    eos_ids: frozenset[int],
    device: torch.device,
) -> list[tuple[bool, int]]:
    """For each ``(input_ids, labels)`` row: whether the arg-max at every labelled
    position up to the first end-of-turn token (``eos_ids``) is the label there, i.e.
    whether greedy decoding of its prompt gives its target (module docstring), and how
    many tokens that target is (the end of turn included). Leaves ``model`` in the mode
    it found it."""
    was_training = model.training
    model.eval()
    found: list[tuple[bool, int]] = []
    with torch.no_grad():
        for input_ids, labels in rows:
            logits = model(input_ids=torch.tensor([input_ids], device=device)).logits[0]
            positions = [t for t, label in enumerate(labels) if label != IGNORE_INDEX and t > 0]
            wanted = [labels[t] for t in positions]
            ends = [k for k, token in enumerate(wanted) if token in eos_ids]
            if ends:
                positions, wanted = positions[: ends[0] + 1], wanted[: ends[0] + 1]
            predicted = logits[[t - 1 for t in positions]].argmax(dim=-1).tolist()
            found.append((bool(positions) and predicted == wanted, len(positions)))
    model.train(was_training)
    return found

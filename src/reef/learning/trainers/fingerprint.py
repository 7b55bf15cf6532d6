"""Computing a trained model's fingerprint (``reef.releases.fingerprints``) in the
training child, with the trainer's own model, before its directory is stored.

Each probe's prompt goes through the chat template as the engine renders a chat
request (``add_generation_prompt``); then greedy decoding, one full forward pass per
new token (no cache: at most ``MAX_NEW_TOKENS`` passes over a short prompt, and the
exact arithmetic the trainer computes with), up to the first end-of-turn token. For
each position it keeps the arg-max token, its log-probability (log-softmax of the
float32 logits) and the margin to the runner-up. Under bf16 autocast (the trainer's
CUDA default) the dtype recorded is ``bfloat16``, else the weights' dtype.

For a PEFT adapter (a model with ``disable_adapter()``) the same greedy tokens are then
scored with the adapter disabled (one teacher-forced pass per probe): the largest
|adapter - base| logprob over all positions is ``base_gap`` and whether the base's
arg-max differs anywhere is ``base_differs``, so verification can say when the
tolerance it uses cannot tell the adapter from the base model.
Imports torch: runs in the training child.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from reef.learning.trainers.precision import autocast
from reef.releases import (
    MAX_NEW_TOKENS,
    Dtype,
    Fingerprint,
    FingerprintProbe,
    probe_prompts,
)

_DTYPES: dict[torch.dtype, Dtype] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}


@dataclass(frozen=True)
class TrainedModel:
    """What a fingerprint is computed with: the trained model, its tokenizer, its
    end-of-turn ids, the device, and whether the trainer computes under bf16 autocast."""

    model: Any
    tokenizer: PreTrainedTokenizerBase
    eos_ids: frozenset[int]
    device: torch.device
    bf16: bool


def training_prompts(examples: Sequence[Any]) -> list[list[dict[str, Any]]]:
    """The prompts of ``examples`` (SFT examples, preference pairs, KTO examples, RL
    prompts: anything with ``messages`` and optional ``tools``) that can be probed as
    plain chat (no tools offered, no tool calls or results in them), in order."""
    return [
        list(example.messages)
        for example in examples
        if not getattr(example, "tools", None)
        and not any(m.get("tool_calls") or m.get("role") == "tool" for m in example.messages)
    ]


def write_fingerprint(trained: TrainedModel, examples: Sequence[Any], directory: Path) -> None:
    """Compute the fingerprint of ``trained`` on ``examples``' plain-chat prompts (filled
    up from the built-in set) and write it into ``directory``, the saved adapter or
    checkpoint, so that the artifact's digest covers it."""
    compute_fingerprint(trained, training_prompts(examples)).write(directory)


def compute_fingerprint(
    trained: TrainedModel,
    prompts: Sequence[Sequence[dict[str, Any]]],
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> Fingerprint:
    """The fingerprint of ``trained`` on :func:`probe_prompts` of ``prompts`` (module
    docstring). Leaves the model in the mode it found it."""
    model = trained.model
    was_training = model.training
    model.eval()
    probes = []
    gap: tuple[float, bool] | None = None
    with torch.no_grad(), autocast(trained.device, trained.bf16):
        for messages in probe_prompts(prompts):
            probes.append(_probe(trained, messages, max_new_tokens))
        if hasattr(model, "disable_adapter"):
            with model.disable_adapter():
                gap = _base_gap(trained, probes)
    model.train(was_training)
    weights = next(model.parameters()).dtype
    dtype: Dtype = "bfloat16" if trained.bf16 else _DTYPES.get(weights, "float32")
    return Fingerprint(
        dtype=dtype,
        max_new_tokens=max_new_tokens,
        probes=probes,
        base_gap=None if gap is None else gap[0],
        base_differs=None if gap is None else gap[1],
    )


def _base_gap(trained: TrainedModel, probes: Sequence[FingerprintProbe]) -> tuple[float, bool]:
    """With the adapter disabled (the caller's context): the largest |Δ logprob| of the
    probes' greedy tokens against the adapter's, and whether the base's arg-max differs
    at any position (the end of turn included where the probe ended)."""
    largest = 0.0
    differs = False
    for probe in probes:
        ids = _prompt_ids(trained, probe.messages)
        batch = torch.tensor([ids + probe.tokens], device=trained.device)
        scores = torch.log_softmax(trained.model(input_ids=batch).logits[0].float(), dim=-1)
        for position, token in enumerate(probe.tokens):
            row = scores[len(ids) - 1 + position]
            largest = max(largest, abs(float(row[token]) - probe.logprobs[position]))
            differs = differs or int(row.argmax()) != token
        if probe.ended:
            differs = differs or int(scores[-1].argmax()) not in trained.eos_ids
    return round(largest, 6), differs


def _prompt_ids(trained: TrainedModel, messages: list[dict[str, Any]]) -> list[int]:
    return list(
        trained.tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
    )


def _probe(
    trained: TrainedModel, messages: list[dict[str, Any]], max_new_tokens: int
) -> FingerprintProbe:
    ids = _prompt_ids(trained, messages)
    tokens: list[int] = []
    logprobs: list[float] = []
    margins: list[float] = []
    ended = False
    for _ in range(max_new_tokens + 1):
        batch = torch.tensor([ids + tokens], device=trained.device)
        logits = trained.model(input_ids=batch).logits[0, -1]
        top = torch.topk(torch.log_softmax(logits.float(), dim=-1), 2)
        token = int(top.indices[0])
        if token in trained.eos_ids:
            ended = True
            break
        if len(tokens) == max_new_tokens:
            break  # one pass more than the tokens kept: whether the turn ends there
        tokens.append(token)
        logprobs.append(round(float(top.values[0]), 6))
        margins.append(round(float(top.values[0] - top.values[1]), 6))
    text = str(trained.tokenizer.decode(tokens, skip_special_tokens=True))
    return FingerprintProbe(
        messages=messages, tokens=tokens, text=text, logprobs=logprobs, margins=margins, ended=ended
    )

"""The LoRA preference training function: DPO on pairs, KTO on unpaired examples.
Imports torch, transformers and peft: only the training child (``python -m
reef.learning.trainers preference``) or a test imports it.

Sequences are tokenized as for SFT (:func:`lora_sft.build_features`: the chat
template, with the tools offered and earlier tool calls and results rendered as the
engine serves them, so a reply of tool calls is the engine's ``<tool_call>`` text;
prompt tokens labelled -100); a sequence's log-probability is the sum of its reply
tokens' log-probabilities. A pair's chosen and rejected replies share one prompt. Too
long for ``max_seq_len``: whole early turns are dropped (the system message stays),
never part of a turn, and a reply is never truncated: a pair (or KTO example) that
cannot fit so is skipped, with its reason in the ``skipped`` metric
(:func:`prompt_features`). The reference model is the starting point: the base
model (the fresh adapter disabled with PEFT ``disable_adapter()``), or, when continuing,
the base adapter as loaded. Its log-probabilities are computed once, before the first
step, in eval mode and without grad (the reference never changes, so once per batch
would give the same numbers).

Losses (``beta`` = ``spec.beta``; ``logratio`` = policy minus reference log-prob):

- DPO: ``-logsigmoid(beta * (logratio(chosen) - logratio(rejected)))``.
- KTO (simplified): desirable ``1 - sigmoid(beta * (logratio - z0))``, undesirable
  ``1 - sigmoid(beta * (z0 - logratio))``, where ``z0`` is the batch's mean logratio,
  detached and clamped at >= 0: a cheap stand-in for the paper's KL estimate from
  mismatched prompt/reply pairs. Desirable and undesirable examples weigh the same.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from peft import PeftModel

from reef.learning.trainers.budget import split_validation
from reef.learning.trainers.lora_sft import (
    Features,
    Losses,
    Plan,
    _collate,
    reply_tokens,
    set_up,
    token_logps,
    train_and_save,
    without_first_turn,
    wrap_lora,
)
from reef.learning.trainers.precision import autocast, prepare_bf16, use_bf16
from reef.learning.trainers.spec import (
    PreferencePair,
    PreferenceSpec,
    TrainResult,
    UnpairedExample,
)

ProgressCallback = Callable[[int, int, float], None]
"""Called after every optimizer step with (step, total steps, loss)."""


def sequence_logps(model: PeftModel, batch: dict[str, Any]) -> torch.Tensor:
    """Per sequence, the summed log-probability of its labelled (reply) tokens."""
    logps, rows = token_logps(model, batch)
    sums = torch.zeros(batch["labels"].size(0), device=logps.device, dtype=logps.dtype)
    return sums.index_add(0, rows, logps)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weighted mean loss, chosen rewards, rejected rewards); a reward is
    ``beta * logratio``, detached."""
    chosen = beta * (policy_chosen - ref_chosen)
    rejected = beta * (policy_rejected - ref_rejected)
    losses = -torch.nn.functional.logsigmoid(chosen - rejected)
    loss = (losses * weights).sum() / weights.sum()
    return loss, chosen.detach(), rejected.detach()


def kto_loss(
    policy: torch.Tensor,
    reference: torch.Tensor,
    desirable: torch.Tensor,
    beta: float,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weighted mean loss, rewards ``beta * logratio`` detached, z0) of the simplified
    KTO loss in the module docstring."""
    logratio = policy - reference
    z0 = logratio.detach().mean().clamp(min=0.0)
    up = 1.0 - torch.sigmoid(beta * (logratio - z0))
    down = 1.0 - torch.sigmoid(beta * (z0 - logratio))
    losses = torch.where(desirable, up, down)
    loss = (losses * weights).sum() / weights.sum()
    return loss, (beta * logratio).detach(), z0


def prompt_features(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    replies: Sequence[str],
    max_seq_len: int,
) -> list[Features] | str:
    """Each of ``replies`` after one prompt, tokenized as :func:`lora_sft.build_features`
    renders a conversation (the chat template, the tools and earlier calls and results
    as the engine serves them; the prompt labelled -100), or why they cannot be.

    All replies share one prompt: while the longest sequence exceeds ``max_seq_len``,
    whole early turns are dropped (``without_first_turn``: a turn starts at a user
    message; the system message stays). Nothing is ever cut inside a turn, and no reply
    is truncated: when a reply alone, or the last turn with it, is still too long, the
    answer is the reason instead.
    """
    messages = list(messages)
    while True:
        encoded = [reply_tokens(tokenizer, messages, tools, reply) for reply in replies]
        longest = max(len(m.input_ids) for m in encoded)
        if longest <= max_seq_len:
            return [Features(m.input_ids, m.labels, 1.0) for m in encoded]
        reply_length = max(len(m.input_ids) - m.prompt_length for m in encoded)
        if reply_length > max_seq_len:
            return f"a reply alone is {reply_length} tokens, over max_seq_len {max_seq_len}"
        shorter = without_first_turn(messages)
        if shorter is None:
            return (
                f"the last turn with its reply is {longest} tokens, over max_seq_len "
                f"{max_seq_len}, and no earlier turn is left to drop"
            )
        messages = shorter


@torch.no_grad()
def _reference(
    model: PeftModel,
    features: Sequence[Features],
    pad_id: int,
    device: torch.device,
    size: int,
    continued: bool,
) -> torch.Tensor:
    """Reference log-probs of every sequence, before any step: with a fresh adapter the
    model with it disabled (the base); continuing, the base adapter as loaded."""
    model.eval()
    out: list[torch.Tensor] = []
    with contextlib.nullcontext() if continued else model.disable_adapter():
        for start in range(0, len(features), size):
            batch = _collate(features[start : start + size], pad_id, device)
            out.append(sequence_logps(model, batch))
    model.train()
    return torch.cat(out)


def train_preference(spec: PreferenceSpec, progress: ProgressCallback | None = None) -> TrainResult:
    """Train a LoRA adapter by DPO or KTO and save it to ``spec.output_dir``.

    Deterministic for a given spec on one device. Metrics: ``loss_curve``,
    ``margin_curve`` and ``accuracy_curve`` (per step), ``reward_margin`` and
    ``reward_accuracy`` (the last step), ``tokens``, ``seconds``, ``tokens_per_second``,
    ``load_seconds``, ``steps``, ``objective``, ``pairs``/``examples``, ``skipped``
    (the pairs or examples too long to train, by index with the reason), ``device``,
    ``continued``. DPO: margin is chosen minus rejected reward, accuracy the share of
    pairs where it is positive. KTO: margin is mean desirable minus mean undesirable
    reward, accuracy the share of rewards with the right sign (> 0 desirable, < 0 not).
    """
    setup = set_up(spec)
    started, rng, device, loaded = setup.started, setup.rng, setup.device, setup.loaded
    tokenizer, pad_id = loaded.tokenizer, setup.pad_id
    dpo = spec.objective == "dpo"
    # Sequence 2i is kept pair i's chosen reply, 2i + 1 its rejected one (KTO: one each).
    features, weights, desirable, skipped = _items(tokenizer, spec)
    model = wrap_lora(loaded.model, spec.base_adapter, spec.lora).to(device)
    bf16 = use_bf16(spec.bf16, device)
    model = prepare_bf16(model, device, bf16)
    with autocast(device, bf16):
        reference = _reference(
            model, features, pad_id, device, 2 * spec.batch_size, spec.base_adapter is not None
        )
    budget = spec.budget
    train_ids, val_ids = split_validation(len(weights), budget, rng)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.lr)
    load_seconds = time.monotonic() - started
    margins: list[float] = []
    accuracies: list[float] = []
    tokens = 0

    def objective(items: list[int]) -> tuple[torch.Tensor, float, float, int]:
        """(loss, reward margin, reward accuracy, tokens) of ``items``."""
        rows = [2 * i + k for i in items for k in (0, 1)] if dpo else items
        batch = _collate([features[r] for r in rows], pad_id, device)
        policy = sequence_logps(model, batch)
        ref = reference[rows]
        w = torch.tensor([weights[i] for i in items], device=device)
        if dpo:
            loss, chosen, rejected = dpo_loss(
                policy[0::2], policy[1::2], ref[0::2], ref[1::2], spec.beta, w
            )
            margin = chosen - rejected
            return loss, float(margin.mean()), float((margin > 0).float().mean()), _tokens(batch)
        good = torch.tensor([desirable[i] for i in items], device=device)
        loss, rewards, _z0 = kto_loss(policy, ref, good, spec.beta, w)
        up = float(rewards[good].mean()) if bool(good.any()) else 0.0
        down = float(rewards[~good].mean()) if bool((~good).any()) else 0.0
        right = torch.where(good, rewards > 0, rewards < 0)
        return loss, up - down, float(right.float().mean()), _tokens(batch)

    def step(items: list[int]) -> torch.Tensor:
        nonlocal tokens
        with autocast(device, bf16):
            loss, margin, accuracy, fed = objective(items)
        margins.append(round(margin, 6))
        accuracies.append(round(accuracy, 6))
        tokens += fed
        return loss

    def validate() -> float:
        model.eval()
        with torch.no_grad(), autocast(device, bf16):
            size = spec.batch_size
            chunks = [val_ids[i : i + size] for i in range(0, len(val_ids), size)]
            losses = [float(objective(chunk)[0]) * len(chunk) for chunk in chunks]
        model.train()
        return sum(losses) / len(val_ids)

    plan = Plan(train_ids, spec.batch_size, rng)
    run = train_and_save(
        model, optimizer, spec, plan, Losses(step, validate if val_ids else None), progress
    )
    curve, steps_run, seconds = run.curve, run.steps_run, run.seconds
    metrics: dict[str, Any] = {
        "objective": spec.objective,
        "bf16": bf16,
        "loss_curve": curve,
        "margin_curve": margins,
        "accuracy_curve": accuracies,
        "reward_margin": margins[-1],
        "reward_accuracy": accuracies[-1],
        "tokens": tokens,
        "seconds": round(seconds, 4),
        "cpu_seconds": round(run.cpu_seconds, 4),
        "tokens_per_second": round(tokens / seconds, 2) if seconds > 0 else 0.0,
        "load_seconds": round(load_seconds, 4),
        "steps": steps_run,
        "pairs": len(spec.pairs),
        "examples": len(spec.examples),
        "skipped": skipped,
        "train_items": len(train_ids),
        "val_items": len(val_ids),
        "device": device.type,
        "continued": spec.base_adapter is not None,
        **run.report,
    }
    return TrainResult(adapter_dir=spec.output_dir, metrics=metrics)


def _items(
    tokenizer: Any, spec: PreferenceSpec
) -> tuple[list[Features], list[float], list[bool], list[dict[str, Any]]]:
    """(sequences, weights, desirability, skipped) of ``spec``'s pairs or examples:
    DPO has two sequences per kept pair (chosen, rejected) sharing one prompt, KTO one
    per kept example; ``skipped`` names each item left out (``index``) and why
    (``reason``, from :func:`prompt_features`). Raises ValueError when none is left."""
    n = spec.max_seq_len
    features: list[Features] = []
    weights: list[float] = []
    desirable: list[bool] = []
    skipped: list[dict[str, Any]] = []
    items: Sequence[PreferencePair | UnpairedExample] = (
        spec.pairs if spec.objective == "dpo" else spec.examples
    )
    for index, item in enumerate(items):
        if isinstance(item, PreferencePair):
            replies, good = [item.chosen, item.rejected], True
        else:
            replies, good = [item.target], item.desirable
        found = prompt_features(tokenizer, item.messages, item.tools, replies, n)
        if isinstance(found, str):
            skipped.append({"index": index, "reason": found})
            continue
        features.extend(found)
        weights.append(item.weight)
        desirable.append(good)
    if not weights:
        what = "pair" if spec.objective == "dpo" else "example"
        raise ValueError(f"no {what} fits max_seq_len {n}: {skipped[0]['reason']}")
    return features, weights, desirable, skipped


def _tokens(batch: dict[str, Any]) -> int:
    return int(batch["attention_mask"].sum())

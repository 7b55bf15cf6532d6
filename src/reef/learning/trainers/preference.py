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

Losses (``beta`` = ``spec.beta``; ``logratio`` = policy minus reference log-prob), each
TRL 1.16's of the same name, equal to it within 1e-5 (loss) and 1e-4 (gradients) on the
same model and batch (tests/learning/test_trl_equality.py calls TRL's trainers):

- DPO (``spec.loss_type``; ``delta`` = logratio(chosen) - logratio(rejected)):
  ``sigmoid`` ``-logsigmoid(beta * delta)``; ``hinge`` ``relu(1 - beta * delta)``;
  ``ipo`` ``(delta' - 1 / (2 * beta)) ** 2``, where ``delta'`` divides each logratio by
  its reply's token count, as TRL does.
- KTO: desirable ``1 - sigmoid(beta * (logratio - kl))``, undesirable
  ``1 - sigmoid(beta * (kl - logratio))``, scaled by ``desirable_weight`` and
  ``undesirable_weight``. ``kl`` is TRL's estimate: the batch's mean logratio of
  mismatched sequences (each example's prompt with another example's reply), detached
  and clamped at >= 0. TRL pairs each example with the reply of the one before it in
  fixed chunks of the batch size and samples those chunks in order; Reef samples batches
  at random, so it pairs each example with the previous kept example's reply over the
  whole list (the two agree when the batch is the whole list). Their reference log-probs are
  computed once with the others, the policy's under no grad at each step, as in TRL.

A batch's loss is the items' weighted mean (``weight``; TRL's plain mean when every
weight is 1).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from peft import PeftModel

from reef.learning.trainers.budget import split_validation
from reef.learning.trainers.fingerprint import TrainedModel, write_fingerprint
from reef.learning.trainers.lora_sft import (
    Features,
    Losses,
    Plan,
    collate,
    reply_tokens,
    set_up,
    token_logps,
    train_and_save,
    without_first_turn,
    wrap_lora,
)
from reef.learning.trainers.masking import IGNORE_INDEX
from reef.learning.trainers.precision import autocast, prepare_bf16, use_bf16
from reef.learning.trainers.spec import (
    DpoLossType,
    PreferencePair,
    PreferenceSpec,
    ProgressCallback,
    TrainResult,
    UnpairedExample,
)


def sequence_logps(model: PeftModel, batch: dict[str, Any]) -> torch.Tensor:
    """Per sequence, the summed log-probability of its labelled (reply) tokens."""
    logps, rows = token_logps(model, batch)
    sums = torch.zeros(batch["labels"].size(0), device=logps.device, dtype=logps.dtype)
    return sums.index_add(0, rows, logps)


def dpo_loss(
    chosen_ratio: torch.Tensor,
    rejected_ratio: torch.Tensor,
    beta: float,
    weights: torch.Tensor,
    loss_type: DpoLossType = "sigmoid",
    lengths: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weighted mean loss, chosen rewards, rejected rewards) of the ``loss_type`` in
    the module docstring, from each pair's chosen and rejected logratio (policy minus
    reference log-prob); a reward is ``beta * logratio``, detached. ``lengths``: the
    chosen and rejected replies' token counts, which ``ipo`` needs."""
    delta = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        losses = -torch.nn.functional.logsigmoid(beta * delta)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * delta)
    else:
        if lengths is None:
            raise ValueError("the ipo loss needs the replies' token counts (lengths)")
        chosen_len, rejected_len = (n.clamp(min=1.0) for n in lengths)
        per_token = chosen_ratio / chosen_len - rejected_ratio / rejected_len
        losses = (per_token - 1 / (2 * beta)) ** 2
    loss = (losses * weights).sum() / weights.sum()
    return loss, (beta * chosen_ratio).detach(), (beta * rejected_ratio).detach()


def kl_estimate(policy_kl: torch.Tensor, reference_kl: torch.Tensor) -> torch.Tensor:
    """KTO's reference point from mismatched sequences' log-probs: their mean logratio,
    detached, clamped at >= 0 (0 without any)."""
    if policy_kl.numel() == 0:
        return torch.zeros((), device=policy_kl.device)
    return (policy_kl - reference_kl).mean().detach().clamp(min=0.0)


def kto_loss(
    logratio: torch.Tensor,
    desirable: torch.Tensor,
    beta: float,
    weights: torch.Tensor,
    kl: torch.Tensor,
    class_weights: tuple[float, float] = (1.0, 1.0),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted mean loss, rewards ``beta * logratio`` detached) of the KTO loss in the
    module docstring, from each example's logratio (policy minus reference log-prob),
    at reference point ``kl`` (:func:`kl_estimate`); ``class_weights``: (desirable,
    undesirable)."""
    up = class_weights[0] * (1.0 - torch.sigmoid(beta * (logratio - kl)))
    down = class_weights[1] * (1.0 - torch.sigmoid(beta * (kl - logratio)))
    losses = torch.where(desirable, up, down)
    loss = (losses * weights).sum() / weights.sum()
    return loss, (beta * logratio).detach()


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
            batch = collate(features[start : start + size], pad_id, device)
            out.append(sequence_logps(model, batch))
    model.train()
    return torch.cat(out)


@dataclass(frozen=True)
class Prepared:
    """A run's sequences (:func:`prepare`): ``features`` as in :func:`_items`, with
    their ``reference`` log-probs; KTO's ``mismatched`` sequence per kept example (its
    prompt with the previous kept example's reply; None when there is no other example,
    or it does not fit) and their ``reference_kl`` log-probs (0 where None)."""

    features: list[Features]
    weights: list[float]
    desirable: list[bool]
    skipped: list[dict[str, Any]]
    mismatched: list[Features | None]
    reference: torch.Tensor
    reference_kl: torch.Tensor


@dataclass(frozen=True)
class Outcome:
    """A batch's loss, reward margin and accuracy (see :func:`train_preference`),
    tokens fed, and KTO's reference point ``kl`` (0 for DPO)."""

    loss: torch.Tensor
    margin: float
    accuracy: float
    tokens: int
    kl: float


def prepare(
    model: PeftModel, tokenizer: Any, spec: PreferenceSpec, pad_id: int, device: torch.device
) -> Prepared:
    """``spec``'s sequences tokenized and their reference log-probs computed (in eval
    mode, without grad, before any step)."""
    features, weights, desirable, skipped, mismatched = _items(tokenizer, spec)
    size, continued = 2 * spec.batch_size, spec.base_adapter is not None
    reference = _reference(model, features, pad_id, device, size, continued)
    present = [f for f in mismatched if f is not None]
    reference_kl = torch.zeros(len(mismatched), device=device, dtype=reference.dtype)
    if present:
        found = _reference(model, present, pad_id, device, size, continued)
        where = [i for i, f in enumerate(mismatched) if f is not None]
        reference_kl[where] = found.to(reference_kl.dtype)
    return Prepared(features, weights, desirable, skipped, mismatched, reference, reference_kl)


def batch_objective(
    model: PeftModel,
    data: Prepared,
    items: list[int],
    spec: PreferenceSpec,
    pad_id: int,
    device: torch.device,
) -> Outcome:
    """The loss of kept pairs (or KTO examples) ``items`` under ``spec``'s objective,
    as each training step and validation computes it."""
    if spec.objective == "dpo":
        return _dpo_objective(model, data, items, spec, pad_id, device)
    return _kto_objective(model, data, items, spec, pad_id, device)


def _dpo_objective(
    model: PeftModel,
    data: Prepared,
    items: list[int],
    spec: PreferenceSpec,
    pad_id: int,
    device: torch.device,
) -> Outcome:
    rows = [2 * i + k for i in items for k in (0, 1)]
    batch = collate([data.features[r] for r in rows], pad_id, device)
    policy = sequence_logps(model, batch)
    ref = data.reference[rows]
    w = torch.tensor([data.weights[i] for i in items], device=device)
    counts = (batch["labels"] != IGNORE_INDEX).sum(dim=1).to(policy.dtype)
    loss, chosen, rejected = dpo_loss(
        policy[0::2] - ref[0::2],
        policy[1::2] - ref[1::2],
        spec.beta,
        w,
        spec.loss_type,
        (counts[0::2], counts[1::2]),
    )
    margin = chosen - rejected
    accuracy = float((margin > 0).float().mean())
    return Outcome(loss, float(margin.mean()), accuracy, _tokens(batch), 0.0)


def _kto_objective(
    model: PeftModel,
    data: Prepared,
    items: list[int],
    spec: PreferenceSpec,
    pad_id: int,
    device: torch.device,
) -> Outcome:
    fed = 0
    kl_rows = [i for i in items if data.mismatched[i] is not None]
    kl_features = [f for f in (data.mismatched[i] for i in kl_rows) if f is not None]
    policy_kl = torch.zeros(0, device=device)
    if kl_features:
        kl_batch = collate(kl_features, pad_id, device)
        with torch.no_grad():
            policy_kl = sequence_logps(model, kl_batch)
        fed += _tokens(kl_batch)
    kl = kl_estimate(policy_kl, data.reference_kl[kl_rows].to(policy_kl.dtype))
    batch = collate([data.features[i] for i in items], pad_id, device)
    policy = sequence_logps(model, batch)
    good = torch.tensor([data.desirable[i] for i in items], device=device)
    w = torch.tensor([data.weights[i] for i in items], device=device)
    class_weights = (spec.desirable_weight, spec.undesirable_weight)
    logratio = policy - data.reference[items]
    loss, rewards = kto_loss(logratio, good, spec.beta, w, kl, class_weights)
    up = float(rewards[good].mean()) if bool(good.any()) else 0.0
    down = float(rewards[~good].mean()) if bool((~good).any()) else 0.0
    right = torch.where(good, rewards > 0, rewards < 0)
    accuracy = float(right.float().mean())
    return Outcome(loss, up - down, accuracy, fed + _tokens(batch), float(kl))


def train_preference(spec: PreferenceSpec, progress: ProgressCallback | None = None) -> TrainResult:
    """Train a LoRA adapter by DPO or KTO and save it to ``spec.output_dir``.

    Deterministic for a given spec on one device. Metrics: ``loss_curve``,
    ``margin_curve`` and ``accuracy_curve`` (per step), ``reward_margin`` and
    ``reward_accuracy`` (the last step), ``tokens``, ``seconds``, ``tokens_per_second``,
    ``load_seconds``, ``steps``, ``objective``, ``loss_type`` (DPO), ``kl_curve`` (KTO's
    reference point per step), ``pairs``/``examples``, ``skipped`` (the pairs or
    examples too long to train, by index with the reason), ``device``, ``continued``.
    DPO: margin is chosen minus rejected reward, accuracy the share of pairs where it is
    positive. KTO: margin is mean desirable minus mean undesirable reward, accuracy the
    share of rewards with the right sign (> 0 desirable, < 0 not).
    """
    setup = set_up(spec)
    started, rng, device, loaded = setup.started, setup.rng, setup.device, setup.loaded
    pad_id = setup.pad_id
    model = wrap_lora(loaded.model, spec.base_adapter, spec.lora).to(device)
    bf16 = use_bf16(spec.bf16, device)
    model = prepare_bf16(model, device, bf16)
    with autocast(device, bf16):
        data = prepare(model, loaded.tokenizer, spec, pad_id, device)
    budget = spec.budget
    train_ids, val_ids = split_validation(len(data.weights), budget, rng)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.lr)
    load_seconds = time.monotonic() - started
    margins: list[float] = []
    accuracies: list[float] = []
    kls: list[float] = []
    tokens = 0

    def step(items: list[int]) -> torch.Tensor:
        nonlocal tokens
        with autocast(device, bf16):
            out = batch_objective(model, data, items, spec, pad_id, device)
        margins.append(round(out.margin, 6))
        accuracies.append(round(out.accuracy, 6))
        kls.append(round(out.kl, 6))
        tokens += out.tokens
        return out.loss

    def validate() -> float:
        model.eval()
        with torch.no_grad(), autocast(device, bf16):
            size = spec.batch_size
            chunks = [val_ids[i : i + size] for i in range(0, len(val_ids), size)]
            losses = [
                float(batch_objective(model, data, chunk, spec, pad_id, device).loss) * len(chunk)
                for chunk in chunks
            ]
        model.train()
        return sum(losses) / len(val_ids)

    plan = Plan(train_ids, spec.batch_size, rng)
    run = train_and_save(
        model, optimizer, spec, plan, Losses(step, validate if val_ids else None), progress
    )
    curve, steps_run, seconds = run.curve, run.steps_run, run.seconds
    by_objective: dict[str, Any] = (
        {"loss_type": spec.loss_type} if spec.objective == "dpo" else {"kl_curve": kls}
    )
    metrics: dict[str, Any] = {
        "objective": spec.objective,
        **by_objective,
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
        "skipped": data.skipped,
        "train_items": len(train_ids),
        "val_items": len(val_ids),
        "device": device.type,
        "continued": spec.base_adapter is not None,
        **run.report,
    }
    trained = TrainedModel(model, loaded.tokenizer, loaded.eos_token_ids, device, bf16)
    write_fingerprint(trained, [*spec.pairs, *spec.examples], spec.output_dir)
    return TrainResult(adapter_dir=spec.output_dir, metrics=metrics)


Items = tuple[list[Features], list[float], list[bool], list[dict[str, Any]], list[Features | None]]
"""What :func:`_items` answers."""


def _items(tokenizer: Any, spec: PreferenceSpec) -> Items:
    """(sequences, weights, desirability, skipped, mismatched) of ``spec``'s pairs or
    examples: DPO has two sequences per kept pair (chosen, rejected) sharing one prompt,
    KTO one per kept example and its mismatched sequence (:class:`Prepared`; DPO: none);
    ``skipped`` names each item left out (``index``) and why (``reason``, from
    :func:`prompt_features`). Raises ValueError when none is left."""
    n = spec.max_seq_len
    features: list[Features] = []
    weights: list[float] = []
    desirable: list[bool] = []
    skipped: list[dict[str, Any]] = []
    kept: list[PreferencePair | UnpairedExample] = []
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
        kept.append(item)
    if not weights:
        what = "pair" if spec.objective == "dpo" else "example"
        raise ValueError(f"no {what} fits max_seq_len {n}: {skipped[0]['reason']}")
    examples = [k for k in kept if isinstance(k, UnpairedExample)]
    return features, weights, desirable, skipped, _mismatched(tokenizer, examples, n)


def _mismatched(
    tokenizer: Any, examples: list[UnpairedExample], max_seq_len: int
) -> list[Features | None]:
    """Each example's prompt with the previous example's reply (the first's with the
    last's: TRL's rotation by one), tokenized as the others; None with a single example
    or where the sequence cannot fit."""
    if len(examples) < 2:
        return [None] * len(examples)
    out: list[Features | None] = []
    for k, example in enumerate(examples):
        reply = examples[k - 1].target
        found = prompt_features(tokenizer, example.messages, example.tools, [reply], max_seq_len)
        out.append(None if isinstance(found, str) else found[0])
    return out


def _tokens(batch: dict[str, Any]) -> int:
    return int(batch["attention_mask"].sum())

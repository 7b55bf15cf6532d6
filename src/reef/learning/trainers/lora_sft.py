"""The SFT training function (a LoRA adapter, or ``full``: every weight, saved as a
checkpoint). Imports torch, transformers and peft: the worker
never imports this module; it runs in the training child (``python -m
reef.learning.trainers``), in a test, or in a Ray task.

The model and tokenizer come from ``reef.engine.models.load_model``, the loader the
engine serves with, so training sees the same weights and chat template. Loss counts
only the reply's tokens and its end-of-turn token (``reef.learning.trainers.masking``);
the rest is labelled -100.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedTokenizerBase

from reef.engine.models import LoadedModel, load_model
from reef.learning.trainers.budget import (
    Budget,
    EarlyStopping,
    StopReason,
    batch_plan,
    epoch_steps,
    eval_interval,
    fitted,
    known,
    lr_factor,
    planned_steps,
    split_validation,
    stop_report,
    time_stop,
)
from reef.learning.trainers.fingerprint import (
    TrainedModel,
    compute_fingerprint,
    training_prompts,
)
from reef.learning.trainers.logit_distill import (
    TeacherTarget,
    align_teacher_tokens,
    teacher_batch,
    teacher_kl,
)
from reef.learning.trainers.masking import IGNORE_INDEX, MaskedTokens, mask_conversation
from reef.learning.trainers.precision import autocast, prepare_bf16, use_bf16
from reef.learning.trainers.probe import greedy_matches, probe_indices
from reef.learning.trainers.spec import (
    LoraSettings,
    PreferenceSpec,
    ProgressCallback,
    RLSpec,
    SFTExample,
    SFTSpec,
    TrainResult,
)

ADAPTER_FILES = frozenset({"adapter_config.json", "adapter_model.safetensors"})


@dataclass(frozen=True)
class Features:
    """One tokenized example: ids, labels (-100 where no loss) and its weight; with
    logit distillation, the teacher's distributions at its aligned positions and how
    many of the teacher's positions were skipped (``reef.learning.trainers.logit_distill``)."""

    input_ids: list[int]
    labels: list[int]
    weight: float
    teacher: tuple[TeacherTarget, ...] = ()
    teacher_skipped: int = 0


def chat_token_ids(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], **kw: Any
) -> Any:
    return tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=False, **kw)


def build_features(
    tokenizer: PreTrainedTokenizerBase,
    example: SFTExample,
    max_seq_len: int,
    align: bool = False,
) -> Features:
    """Tokenize ``example`` with the tokenizer's chat template; only the reply trains
    (:func:`reply_tokens`, the rule of :mod:`reef.learning.trainers.masking`). With
    ``align``, its ``teacher_tokens`` are aligned with the reply's tokens
    (:func:`reef.learning.trainers.logit_distill.align_teacher_tokens`).

    Longer than ``max_seq_len``: whole early turns are dropped (a turn starts at a user
    message; the system message stays) until it fits; then, if the last turn alone is
    too long, the prompt's start.
    """
    messages = list(example.messages)
    while True:
        masked = reply_tokens(tokenizer, messages, example.tools, example.target)
        shorter = without_first_turn(messages)
        if len(masked.input_ids) <= max_seq_len or shorter is None:
            break
        messages = shorter
    full, labels = masked.input_ids, masked.labels
    if len(full) > max_seq_len:
        cut = min(len(full) - max_seq_len, masked.prompt_length)
        full, labels = full[cut:][:max_seq_len], labels[cut:][:max_seq_len]
    if not (align and example.teacher_tokens):
        return Features(full, labels, example.weight)
    found = align_teacher_tokens(tokenizer, full, labels, example.teacher_tokens)
    return Features(full, labels, example.weight, found.targets, found.skipped)


def prompt_length(prompt: list[int], full: list[int]) -> int:
    """How many leading tokens ``prompt`` and ``full`` share."""
    shared = 0
    for a, b in zip(prompt, full, strict=False):
        if a != b:
            break
        shared += 1
    return shared


def reply_tokens(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    reply_text: str,
) -> MaskedTokens:
    """``messages`` with ``tools`` and ``reply_text`` as the assistant's last turn,
    rendered as the engine renders a request (``reef.core.chat_format.render_tools``), with
    the reply's tokens (and its end-of-turn token) the only ones that train
    (:func:`reef.learning.trainers.masking.mask_conversation`)."""
    reply = {"role": "assistant", "content": reply_text}
    return mask_conversation(tokenizer, [*messages, reply], tools, turns="last")


def without_first_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``messages`` without their first turn (from the first user message up to the
    next, with the assistant's calls and the tool results in between); the system
    message stays. None when only one turn is left."""
    lead = messages[:1] if messages and messages[0].get("role") == "system" else []
    rest = messages[len(lead) :]
    starts = [i for i, m in enumerate(rest) if m.get("role") == "user"]
    if len(starts) < 2:
        return None
    return [*lead, *rest[starts[1] :]]


def collate(batch: Sequence[Features], pad_id: int, device: torch.device) -> dict[str, Any]:
    """``batch`` padded with ``pad_id`` (labels ignored there) as tensors on ``device``."""
    width = max(len(f.input_ids) for f in batch)
    ids = [f.input_ids + [pad_id] * (width - len(f.input_ids)) for f in batch]
    labels = [f.labels + [IGNORE_INDEX] * (width - len(f.labels)) for f in batch]
    mask = [[1] * len(f.input_ids) + [0] * (width - len(f.input_ids)) for f in batch]
    out = {
        "input_ids": torch.tensor(ids, device=device),
        "attention_mask": torch.tensor(mask, device=device),
        "labels": torch.tensor(labels, device=device),
        "weights": torch.tensor([f.weight for f in batch], device=device),
        "shared": shared_prefix(batch),
    }
    if any(f.teacher for f in batch):  # logit distillation (``logit_distill``)
        out["teacher"] = teacher_batch([(f.labels, f.teacher, f.weight) for f in batch], device)
    return out


MIN_SHARED_PREFIX = 32
"""Shortest prompt prefix, in tokens, that the rows of a batch must share for the
decoder to run it once (:func:`decoder_states`): below it, the extra forward call costs
about what it saves."""


def shared_prefix(batch: Sequence[Features]) -> int:
    """How many leading tokens every row of ``batch`` shares that carry no label and
    precede the last position before each row's first label (the hidden states a loss
    reads start there): 0 for a single row or a prefix under ``MIN_SHARED_PREFIX``."""
    if len(batch) < 2:
        return 0
    first = batch[0].input_ids
    shared = min(len(f.input_ids) for f in batch) - 1
    for f in batch:
        labelled = next((t for t, label in enumerate(f.labels) if label != IGNORE_INDEX), None)
        if labelled is not None:
            shared = min(shared, labelled - 1)
        shared = min(shared, prompt_length(first[:shared], f.input_ids))
    return shared if shared >= MIN_SHARED_PREFIX else 0


def weighted_loss(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Mean next-token cross entropy over labelled tokens, each token weighted by its
    example's weight (all weights 1: the usual causal-LM loss)."""
    shifted = logits[:, :-1, :].float()
    targets = labels[:, 1:]
    per_token = torch.nn.functional.cross_entropy(
        shifted.reshape(-1, shifted.size(-1)),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).view(targets.shape)
    token_weights = (targets != IGNORE_INDEX).float() * weights[:, None]
    return (per_token * token_weights).sum() / token_weights.sum().clamp(min=1e-8)


# Architectures whose logits are exactly lm_head(final hidden state): no scaling or
# soft-capping, so the head may run on the labelled positions alone.
PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3"})


def _base_of(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (a full fine-tune has none)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def decoder_states(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """The decoder's last hidden states of ``batch`` from position ``start`` on, and
    ``start``: the prompt prefix every row shares (``batch["shared"]``, see
    :func:`shared_prefix`) runs once, for one row, and its keys and values serve every
    row's rest. The same sums as running each row whole (gradients reach the prefix
    through every row), at a fraction of the compute when prompts share a long system
    prompt and demos. ``model`` is a transformers model (under PEFT or not) whose
    decoder takes a cache: with gradient checkpointing, or dropout, it runs whole."""
    base: Any = _base_of(model)
    decoder = base.get_decoder()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    start = int(batch.get("shared", 0))
    if start and not _prefix_exact(model):
        start = 0
    if not start:
        return decoder(input_ids=ids, attention_mask=mask).last_hidden_state, 0
    rows = ids.shape[0]
    cache = decoder(input_ids=ids[:1, :start], use_cache=True).cache
    for layer in cache.layers:
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    rest = decoder(input_ids=ids[:, start:], attention_mask=mask, cache=cache, use_cache=True)
    return rest.last_hidden_state, start


def _prefix_exact(model: Any) -> bool:
    """Whether a shared prefix run once gives what running every row whole gives: no
    dropout drawing a different mask per row, no gradient checkpointing (which turns
    the cache off)."""
    base: Any = _base_of(model)
    if getattr(base, "is_activation_checkpointing", False):
        return False
    return not any(
        isinstance(module, torch.nn.Dropout) and module.p > 0 and module.training
        for module in model.modules()
    )


@dataclass(frozen=True)
class LogitTerm:
    """The logit-distillation term of a run (``SFTSpec.logit_weight`` above 0): its
    weight and temperature, and each step's value of the KL (``curve``)."""

    weight: float
    temperature: float
    curve: list[float]


def labelled_loss(
    model: Any, batch: dict[str, Any], logit_term: LogitTerm | None = None
) -> torch.Tensor:
    """:func:`weighted_loss` of ``batch``, running the output head only on positions
    that have a label when the architecture allows it (the head over a 49k vocabulary
    is a large share of a small model's compute; the prompt needs none of it), and the
    rows' shared prompt prefix once (:func:`decoder_states`). With ``logit_term`` and
    teacher targets in the batch (``batch["teacher"]``), plus its weight times the KL
    to the teacher (:func:`reef.learning.trainers.logit_distill.teacher_kl`), whose
    value is appended to its ``curve``."""
    base: Any = _base_of(model)
    head = base.get_output_embeddings()
    loss: torch.Tensor
    if getattr(base.config, "model_type", None) not in PLAIN_HEAD_TYPES or head is None:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = weighted_loss(logits, batch["labels"], batch["weights"])
        if logit_term is not None and "teacher" in batch:
            labelled = logits[:, :-1][batch["labels"][:, 1:] != IGNORE_INDEX]
            loss = loss + _logit_term(labelled, batch, logit_term)
        return loss
    hidden, start = decoder_states(model, batch)
    targets = batch["labels"][:, start + 1 :]
    keep = targets != IGNORE_INDEX
    logits = head(hidden[:, :-1][keep]).float()
    per_token = torch.nn.functional.cross_entropy(logits, targets[keep], reduction="none")
    weights = batch["weights"][:, None].expand_as(targets)[keep]
    loss = (per_token * weights).sum() / weights.sum().clamp(min=1e-8)
    if logit_term is not None and "teacher" in batch:
        loss = loss + _logit_term(logits, batch, logit_term)
    return loss


def _logit_term(logits: torch.Tensor, batch: dict[str, Any], term: LogitTerm) -> torch.Tensor:
    kl = teacher_kl(logits, batch["teacher"], term.temperature)
    term.curve.append(round(float(kl.detach()), 6))
    return term.weight * kl


def _device(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


@dataclass
class Setup:
    """What every trainer starts from: its start time, a seeded ``rng`` (data order and
    splits), the device, the loaded base model with its tokenizer, the padding id."""

    started: float
    rng: random.Random
    device: torch.device
    loaded: LoadedModel
    pad_id: int


def set_up(spec: SFTSpec | PreferenceSpec | RLSpec) -> Setup:
    """Seed torch and the data order, pin the threads, pick the device, load the model:
    the same first steps for the sft, preference and grpo trainers."""
    started = time.monotonic()
    if spec.threads:
        torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)  # noqa: S311 (seeded or non-secret randomness)
    device = _device(spec.device)
    loaded = load_model(spec.model, spec.home)
    tokenizer = loaded.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return Setup(started, rng, device, loaded, int(pad_id))


def wrap_lora(model: Any, base_adapter: Path | None, lora: LoraSettings) -> PeftModel:
    """``model`` with a trainable LoRA: the adapter at ``base_adapter`` to continue from,
    else a fresh one with ``lora``'s settings. Shared by every trainer."""
    with warnings.catch_warnings():
        # PEFT 0.21 reads a deprecated transformers property while wrapping a model.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing. is deprecated")
        if base_adapter is not None:
            return PeftModel.from_pretrained(model, str(base_adapter), is_trainable=True)
        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, config)


def token_logps(model: PeftModel, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of every labelled token, flat; the row each belongs to). The output
    head runs on labelled positions only when the architecture allows it."""
    base: Any = model.get_base_model()
    head = base.get_output_embeddings()
    if getattr(base.config, "model_type", None) in PLAIN_HEAD_TYPES and head is not None:
        hidden, start = decoder_states(model, batch)
        targets = batch["labels"][:, start + 1 :]
        keep = targets != IGNORE_INDEX
        logits = head(hidden[:, :-1][keep]).float()
    else:
        targets = batch["labels"][:, 1:]
        keep = targets != IGNORE_INDEX
        full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logits = full[:, :-1][keep].float()
    logps = torch.log_softmax(logits, dim=-1).gather(1, targets[keep][:, None])[:, 0]
    return logps, keep.nonzero()[:, 0]


def save_adapter(model: PeftModel, directory: Path) -> None:
    """Save safetensors only, and remove anything else PEFT wrote (model card)."""
    directory.mkdir(parents=True, exist_ok=True)
    # Only the LoRA weights: never a copy of a base layer (lm_head or embeddings).
    model.save_pretrained(str(directory), safe_serialization=True, save_embedding_layers=False)
    for path in directory.iterdir():
        if path.name not in ADAPTER_FILES:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    # PEFT writes target_modules from a set, in hash order: canonicalize the config so
    # identical training gives an identical adapter digest in every process.
    config_path = directory / "adapter_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def full_model(model: Any, spec: SFTSpec, device: torch.device) -> Any:
    """``model`` ready for a full fine-tune: every weight trainable, gradient
    checkpointing when ``spec.gradient_checkpointing`` asks for it (``auto``: on CUDA)."""
    for param in model.parameters():
        param.requires_grad_(True)
    wanted = spec.gradient_checkpointing
    if wanted is True or (wanted == "auto" and device.type == "cuda"):
        model.config.use_cache = False
        # transformers 5 renamed it (the old name warns, and goes in v6)
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)()
    return model.to(device)


def save_checkpoint(model: Any, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """Save a full checkpoint: safetensors shards (with their index when sharded),
    ``config.json``, the generation config and the tokenizer files; never a pickle."""
    directory.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    model.save_pretrained(str(directory), safe_serialization=True, max_shard_size="2GB")
    tokenizer.save_pretrained(str(directory))


def train_lora_sft(spec: SFTSpec, progress: ProgressCallback | None = None) -> TrainResult:
    """Train a LoRA adapter (``spec.mode`` ``lora``) or every weight (``full``: a
    checkpoint) on ``spec.examples`` within ``spec.budget`` and save it to
    ``spec.output_dir``: epochs over the training share of the examples, validation loss
    measured on the rest, early stopping on it with the best weights kept, warmup then
    decay of the learning rate (``reef.learning.trainers.budget``).

    Deterministic for a given spec on one device (seeded split, LoRA init and batch
    order). Raises ``ModelSourceError`` for an unknown model, ``ValueError`` from PEFT for
    target modules the model lacks.
    """
    setup = set_up(spec)
    started, rng, device, loaded = setup.started, setup.rng, setup.device, setup.loaded
    tokenizer, pad_id = loaded.tokenizer, setup.pad_id
    align = spec.logit_weight > 0
    features = [build_features(tokenizer, ex, spec.max_seq_len, align) for ex in spec.examples]
    logit_term = LogitTerm(spec.logit_weight, spec.logit_temperature, []) if align else None
    budget = spec.budget
    train_ids, val_ids = split_validation(len(features), budget, rng)
    full = spec.mode == "full"
    if full:
        model = full_model(loaded.model, spec, device)
    else:
        model = wrap_lora(loaded.model, spec.base_adapter, spec.lora).to(device)
    bf16 = use_bf16(spec.bf16, device)
    model = prepare_bf16(model, device, bf16)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.lr)
    load_seconds = time.monotonic() - started
    tokens = target_tokens = shared_tokens = 0
    sharing = _prefix_exact(model)

    def step(indices: list[int]) -> torch.Tensor:
        nonlocal tokens, target_tokens, shared_tokens
        batch = collate([features[i] for i in indices], pad_id, device)
        tokens += int(batch["attention_mask"].sum())
        target_tokens += int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
        if sharing:
            shared_tokens += batch["shared"] * (len(indices) - 1)
        with autocast(device, bf16):
            return labelled_loss(model, batch, logit_term)

    def validate() -> float:
        with autocast(device, bf16):
            return validation_loss(model, features, val_ids, spec, pad_id, device)

    plan = Plan(train_ids, spec.batch_size, rng)
    losses = Losses(step, validate if val_ids else None)
    if full:
        run = train_in_budget(
            model, optimizer, budget, plan, losses.step, losses.validate, progress, spec.fault
        )
        save_checkpoint(model, tokenizer, spec.output_dir)
    else:
        run = train_and_save(model, optimizer, spec, plan, losses, progress)
    curve, steps_run, seconds = run.curve, run.steps_run, run.seconds
    metrics = {
        "loss_curve": curve,
        "tokens": tokens,
        "target_tokens": target_tokens,
        "shared_tokens": shared_tokens,
        "seconds": round(seconds, 4),
        "cpu_seconds": round(run.cpu_seconds, 4),
        "tokens_per_second": round(tokens / seconds, 2) if seconds > 0 else 0.0,
        "load_seconds": round(load_seconds, 4),
        "steps": steps_run,
        "examples": len(features),
        "train_examples": len(train_ids),
        "val_examples": len(val_ids),
        "epochs_run": round(steps_run * spec.batch_size / max(len(train_ids), 1), 3),
        "device": device.type,
        "continued": spec.base_adapter is not None or spec.continued,
        "mode": spec.mode,
        "bf16": bf16,
        **run.report,
    }
    if logit_term is not None:
        metrics.update(logit_metrics(features, logit_term))
    if spec.probe_size:
        metrics["probe"] = probe(model, tokenizer, features, spec, train_ids, loaded, device)
    trained = TrainedModel(model, tokenizer, loaded.eos_token_ids, device, bf16)
    compute_fingerprint(trained, training_prompts(spec.examples)).write(spec.output_dir)
    if full:
        metrics["parameters"] = sum(p.numel() for p in model.parameters())
    if device.type == "cuda":
        # the child's whole run: model load, training and save (bench/gpu_check.py)
        metrics["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device))
    metrics["peak_rss_bytes"] = peak_rss_bytes()
    return TrainResult(adapter_dir=spec.output_dir, metrics=metrics)


def peak_rss_bytes() -> int | None:
    """The most host memory this process has held resident so far (the training child's
    whole run on a CPU: torch, the model, training and save); None where unknown."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # Linux: KiB


def logit_metrics(features: list[Features], term: LogitTerm) -> dict[str, Any]:
    """What a run with logit distillation reports of it: the teacher positions aligned
    and skipped over its examples, and the KL of each step that had teacher targets."""
    return {
        "teacher_positions_aligned": sum(len(f.teacher) for f in features),
        "teacher_positions_skipped": sum(f.teacher_skipped for f in features),
        "logit_kl_curve": term.curve,
    }


def probe(  # noqa: PLR0913
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    features: list[Features],
    spec: SFTSpec,
    train_ids: list[int],
    loaded: LoadedModel,
    device: torch.device,
) -> list[list[Any]]:
    """``[index, matched, target tokens]`` for a fixed sample of the trained examples:
    whether greedy decoding of each prompt gives its target, and the target's length
    (``reef.learning.trainers.probe``)."""

    def fits(example: SFTExample) -> bool:
        masked = reply_tokens(tokenizer, list(example.messages), [], example.target)
        return len(masked.input_ids) <= spec.max_seq_len

    chosen = probe_indices(spec.examples, train_ids, spec.probe_size, spec.seed, fits)
    rows = [(features[i].input_ids, features[i].labels) for i in chosen]
    with autocast(device, use_bf16(spec.bf16, device)):
        found = greedy_matches(model, rows, loaded.eos_token_ids, device)
    return [[index, hit, length] for index, (hit, length) in zip(chosen, found, strict=True)]


@dataclass(frozen=True)
class Plan:
    """What a budgeted run steps through: the training items, ``batch_size`` per step,
    shuffled by ``rng`` each epoch."""

    items: list[int]
    batch_size: int
    rng: random.Random


@dataclass(frozen=True)
class Accumulated:
    """What a step returns when it ran its own backward passes (micro-batches, one at a
    time, gradients accumulated): the loop then only steps the optimizer and logs
    ``loss``."""

    loss: float


@dataclass(frozen=True)
class BudgetedRun:
    """What :func:`train_in_budget` did: the loss per step, steps run, the loop's wall
    time, the convergence report (``budget.stop_report``) and the loop's CPU time (every
    thread of the training process: on a shared machine wall time grows, CPU time less)."""

    curve: list[float]
    steps_run: int
    seconds: float
    report: dict[str, Any]
    cpu_seconds: float = 0.0


@dataclass(frozen=True)
class Losses:
    """What a run minimises: ``step(items)`` is a training batch's loss (the loop
    back-propagates it); ``validate()`` the validation loss, None without a split."""

    step: Callable[[list[int]], torch.Tensor]
    validate: Callable[[], float] | None


def train_and_save(
    model: Any,
    optimizer: torch.optim.Optimizer,
    spec: SFTSpec | PreferenceSpec,
    plan: Plan,
    losses: Losses,
    progress: ProgressCallback | None,
) -> BudgetedRun:
    """``train_in_budget`` within ``spec``'s budget, then the adapter (or, for a ``full``
    SFT run, the checkpoint: :func:`save_checkpoint`) saved to ``spec.output_dir``."""
    run = train_in_budget(
        model, optimizer, spec.budget, plan, losses.step, losses.validate, progress, spec.fault
    )
    save_adapter(model, spec.output_dir)
    return run


def train_in_budget(  # noqa: PLR0913
    model: Any,
    optimizer: torch.optim.Optimizer,
    budget: Budget,
    plan: Plan,
    step: Callable[[list[int]], torch.Tensor | Accumulated],
    validate: Callable[[], float] | None,
    progress: ProgressCallback | None,
    fault: str | None = None,
) -> BudgetedRun:
    """The training loop every trainer shares: the budget's steps over ``plan`` (epochs,
    caps), the learning-rate schedule, a validation pass (``validate``, None: no split)
    twice per epoch with early stopping and the best weights restored at the end, a stop
    once the training loss sits at the budget's ``fitted_loss`` (``budget.fitted``) or
    after a first pass whose loss was at its ``known_loss`` (``budget.known``), the
    ``max_seconds`` cap and the learning budget's ``deadline_seconds``, checked after
    every step (so a run that starts always makes one). ``step(items)`` returns the
    batch's loss (the loop does the rest of the update) or an ``Accumulated`` (the
    gradients are in place already)."""
    total = planned_steps(len(plan.items), plan.batch_size, budget)
    uncapped = planned_steps(
        len(plan.items), plan.batch_size, budget.model_copy(update={"max_steps": None})
    )
    interval = eval_interval(len(plan.items), plan.batch_size, budget)
    per_epoch = epoch_steps(len(plan.items), plan.batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda number: lr_factor(number, total, budget)
    )
    batches = batch_plan(plan.items, plan.batch_size, total, plan.rng)
    stopper = EarlyStopping(budget)
    best: dict[str, torch.Tensor] | None = None
    reason: StopReason = "steps" if budget.steps is not None else "completed"
    if budget.steps is None and total < uncapped:
        reason = "max_steps"
    curve: list[float] = []
    steps_run = 0
    started, cpu_started = time.monotonic(), time.process_time()
    for number, items in enumerate(batches, start=1):
        value = _backward(step(items))
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        steps_run = number
        curve.append(round(value, 6))
        if progress is not None:
            progress(number, len(batches), curve[-1])
        if fault == "abort":
            os.abort()
        due = number % interval == 0 or number == len(batches)
        if validate is not None and due and stopper.update(number, validate()):
            best = trainable_state(model)
        more = number < len(batches)
        stop = _stop(budget, stopper, curve, more, per_epoch, time.monotonic() - started)
        if stop is not None:
            reason = stop
            break
    seconds, cpu_seconds = time.monotonic() - started, time.process_time() - cpu_started
    if best is not None and stopper.best_step != steps_run:
        restore_state(model, best)
    report = stop_report(reason, stopper, steps_run, total)
    return BudgetedRun(curve, steps_run, seconds, report, cpu_seconds)


def _stop(
    budget: Budget,
    stopper: EarlyStopping,
    curve: list[float],
    more: bool,
    per_epoch: int,
    elapsed: float,
) -> StopReason | None:
    """Why a run stops after its latest step, if it does: validation patience spent,
    the examples learned (``budget.fitted``, after a pass of ``per_epoch`` steps) or known
    from the start (``budget.known``, at the end of the first pass), both only with
    ``more`` steps planned, a time cap or the learning budget's deadline."""
    if stopper.should_stop:
        return "early_stopped"
    if more and fitted(budget, curve, per_epoch):
        return "fitted"
    if more and known(budget, curve, per_epoch):
        return "known"
    return time_stop(budget, elapsed)


def _backward(loss: torch.Tensor | Accumulated) -> float:
    """Backward a step's loss (unless the step did) and return its value."""
    if isinstance(loss, Accumulated):
        return loss.loss
    loss.backward()  # type: ignore[no-untyped-call]
    return float(loss.detach())


def validation_loss(
    model: Any,
    features: list[Features],
    indices: list[int],
    spec: SFTSpec,
    pad_id: int,
    device: torch.device,
) -> float:
    """Mean loss over the labelled tokens of the validation examples, no gradients."""
    model.eval()
    total = weight = 0.0
    with torch.no_grad():
        for start in range(0, len(indices), spec.batch_size):
            chunk = [features[i] for i in indices[start : start + spec.batch_size]]
            batch = collate(chunk, pad_id, device)
            labelled = float(((batch["labels"][:, 1:] != IGNORE_INDEX).float()).sum())
            total += float(labelled_loss(model, batch)) * labelled
            weight += labelled
    model.train()
    return total / weight if weight else 0.0


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """A copy of the trainable weights (LoRA's, or every weight of a full fine-tune)."""
    return {
        name: param.detach().clone()
        for name, param in model.named_parameters()
        if param.requires_grad
    }


def restore_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Put back the weights :func:`trainable_state` copied."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in state:
                param.copy_(state[name])

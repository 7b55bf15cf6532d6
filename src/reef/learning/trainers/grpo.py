"""The LoRA RL training function: GRPO (group-relative policy optimisation, TRL's
objective). Imports torch, transformers and peft: only the training child (``python -m
reef.learning.trainers rl``) or a test imports it.

Every step takes ``batch_size`` prompts and, for each, samples ``group_size``
completions from the current policy: in this process with ``model.generate``
(``engine_url`` None), or from a running engine's ``/v1/chat/completions`` with ``n``,
``logprobs`` and ``return_token_ids`` (the completion token ids come from the engine,
so no re-tokenization). Each completion is scored against its prompt's reference by
the evaluation scorer ``spec.scorer`` (``reef.evaluation.scorers``, built as the gate
builds it); a completion's advantage is ``(r - mean) / (std + eps)`` within its group
(a group whose rewards are all equal teaches nothing and adds zero), times its prompt's
``weight``.

The loss is TRL's GRPO objective (``reef.learning.trainers.rl_loss``: ``loss_type``,
clipped importance ratios, the k3 KL term weighted by ``beta_kl`` against the
reference: the starting point with the adapter disabled (fresh), or the base adapter as
loaded (continuing; a frozen copy of its weights)). The ratios are taken against the
sampler's token log-probs when it reports them (an engine: what it serves is the
policy only until the first update, so later steps are off-policy and the ratios and
clipping correct them); samples drawn here come from the policy before this step's
only update (ratio exactly 1, as TRL with ``num_iterations=1``). The engine's token
log-probs are compared to the trainer's (``engine_logprob_gap``, mean absolute
difference at the first step) as a check that both see the same model.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import torch
from peft import PeftModel

from reef.evaluation import EvalItem, Scorer, ScorerRegistry
from reef.learning.trainers.fingerprint import TrainedModel, write_fingerprint
from reef.learning.trainers.lora_sft import (
    Features,
    Plan,
    chat_token_ids,
    collate,
    save_adapter,
    set_up,
    token_logps,
    train_in_budget,
)
from reef.learning.trainers.masking import sampled_turn
from reef.learning.trainers.precision import autocast, prepare_bf16, use_bf16
from reef.learning.trainers.rl_loss import (
    LossSettings,
    RatioCurves,
    StepTally,
    clipped_loss,
    group_advantages,
    old_logps,
    sequence_weights,
)
from reef.learning.trainers.rl_policy import as_reference, wrap_policy
from reef.learning.trainers.spec import ProgressCallback, RLPrompt, RLSpec, TrainResult


@dataclass(frozen=True)
class Sample:
    """One sampled completion: prompt and completion token ids, its text and (from an
    engine) the sampler's token log-probs."""

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    sampler_logps: list[float] | None = None


def _sample_local(
    model: PeftModel, tokenizer: Any, prompt: RLPrompt, spec: RLSpec, eos: int
) -> list[Sample]:
    prompt_ids = list(chat_token_ids(tokenizer, prompt.messages, add_generation_prompt=True))
    prompt_ids = prompt_ids[-(spec.max_seq_len - spec.max_new_tokens) :]
    model.eval()
    with torch.no_grad():
        out = model.generate(  # type: ignore[no-untyped-call]
            input_ids=torch.tensor([prompt_ids], device=model.device),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long, device=model.device),
            do_sample=True,
            temperature=spec.temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=spec.max_new_tokens,
            num_return_sequences=spec.group_size,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    model.train()
    samples: list[Sample] = []
    for row in out[:, len(prompt_ids) :].tolist():
        ids = row[: row.index(eos) + 1] if eos in row else row
        text = tokenizer.decode([t for t in ids if t != eos], skip_special_tokens=True)
        samples.append(Sample(prompt_ids, ids, text))
    return samples


def _sample_engine(prompt: RLPrompt, spec: RLSpec, seed: int) -> list[Sample]:
    """``group_size`` completions from the engine at ``spec.engine_url``."""
    assert spec.engine_url is not None
    body = {
        "model": spec.engine_model or spec.model,
        "messages": prompt.messages,
        "n": spec.group_size,
        "temperature": spec.temperature,
        "max_tokens": spec.max_new_tokens,
        "logprobs": True,
        "return_token_ids": True,
        "seed": seed,
    }
    request = urllib.request.Request(  # noqa: S310 (the gateway's or engine's own http URL)
        spec.engine_url.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=spec.engine_timeout_seconds) as response:  # noqa: S310 (the gateway's or engine's own http URL)
        answer = json.loads(response.read())
    prompt_ids = [int(t) for t in answer["prompt_token_ids"]]
    samples: list[Sample] = []
    for choice in answer["choices"]:
        content = (choice.get("logprobs") or {}).get("content") or []
        logps = [float(c["logprob"]) for c in content]
        ids = [int(t) for t in choice["token_ids"]]
        text = choice["message"].get("content") or ""
        samples.append(Sample(prompt_ids, ids, text, logps if len(logps) == len(ids) else None))
    return samples


def _features(sample: Sample, weight: float) -> Features:
    masked = sampled_turn(sample.prompt_ids, sample.completion_ids)
    return Features(masked.input_ids, masked.labels, weight)


def reward(scorer: Scorer, text: str, prompt: RLPrompt) -> float:
    """``scorer``'s score of the completion ``text`` against ``prompt``'s reference, as
    the gate scores a reply to an item."""
    item = EvalItem(id="rl", suite="rl", messages=prompt.messages, reference=prompt.reference)
    return scorer.score(text, item).score


def step_loss(
    model: PeftModel,
    batch: dict[str, Any],
    sampled: list[Sample],
    advantages: torch.Tensor,
    settings: LossSettings,
    reference: torch.Tensor | None,
) -> tuple[torch.Tensor, StepTally]:
    """The loss of one step's batch (``reef.learning.trainers.rl_loss``) against the
    sampler's log-probs where recorded, and its tally."""
    policy, rows = token_logps(model, batch)
    lengths = torch.bincount(rows, minlength=len(sampled))
    counts = [int(n) for n in lengths.tolist()]
    old = old_logps(policy, [(n, s.sampler_logps) for n, s in zip(counts, sampled, strict=True)])
    weights = sequence_weights(settings, lengths)[rows]
    parts = clipped_loss(settings, policy, old, reference, advantages[rows], weights)
    tally = StepTally()
    tally.add(parts)
    return parts.loss, tally


def _gap(sampled: list[Sample], batch: dict[str, Any], model: PeftModel) -> float | None:
    """Mean |engine - trainer| token log-prob, when the engine reported all of them."""
    engine = [lp for s in sampled for lp in (s.sampler_logps or [])]
    with torch.no_grad():
        policy, _ = token_logps(model, batch)
    if len(engine) != policy.numel():
        return None
    ours = policy.cpu().tolist()
    return round(statistics.fmean(abs(a - b) for a, b in zip(engine, ours, strict=True)), 6)


def train_grpo(spec: RLSpec, progress: ProgressCallback | None = None) -> TrainResult:
    """Train a LoRA adapter by GRPO and save it to ``spec.output_dir``; with
    ``spec.environment``, over episodes (``reef.learning.trainers.episode_training``).

    Deterministic for a given spec on one device when sampling locally. Metrics:
    ``loss_curve``, ``reward_curve`` (mean reward of the step's samples, before its
    update), ``kl_curve``, ``clip_low_curve``, ``clip_high_curve`` and ``ratio_curve``
    (``RatioCurves``), ``mean_reward`` (the last step), ``samples``, ``tokens``,
    ``seconds``, ``tokens_per_second``, ``load_seconds``, ``steps``, ``prompts``,
    ``sampler`` (``local`` or ``engine``), ``loss_type``, ``engine_logprob_gap``
    (engine only), ``device``, ``continued``. Raises ``ScorerError`` for a scorer that
    cannot run here (a judge needs a model).
    """
    if spec.environment is not None:
        from reef.learning.trainers.episode_training import (
            train_episode_grpo,  # it imports this module
        )

        return train_episode_grpo(spec, progress)
    scorer = ScorerRegistry().build(spec.scorer, "rl.scorer")
    settings = LossSettings.of(spec)
    setup = set_up(spec)
    started, rng, device, loaded = setup.started, setup.rng, setup.device, setup.loaded
    tokenizer, pad_id = loaded.tokenizer, setup.pad_id
    eos = int(tokenizer.eos_token_id)
    continued = spec.base_adapter is not None
    model = wrap_policy(loaded.model, spec).to(device)
    bf16 = use_bf16(spec.bf16, device)
    model = prepare_bf16(model, device, bf16)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=spec.lr)
    # Epochs over the prompts: every prompt gets a group of samples once per epoch.
    budget = spec.budget.model_copy(update={"validation_fraction": 0.0})
    load_seconds = time.monotonic() - started
    rewards_curve: list[float] = []
    curves = RatioCurves.empty()
    gap: float | None = None
    tokens = samples_seen = number = 0

    def step(items: list[int]) -> torch.Tensor:
        nonlocal gap, tokens, samples_seen, number
        number += 1
        feats: list[Features] = []
        advantages: list[float] = []
        step_rewards: list[float] = []
        sampled: list[Sample] = []
        for i in items:
            prompt = spec.prompts[i]
            if spec.engine_url is None:
                with autocast(device, bf16):
                    group = _sample_local(model, tokenizer, prompt, spec, eos)
            else:
                group = _sample_engine(prompt, spec, spec.seed + number * 1000 + i)
            group = [s for s in group if s.completion_ids]
            if not group:
                continue
            rewards = [reward(scorer, s.text, prompt) for s in group]
            step_rewards.extend(rewards)
            advantages.extend(a * prompt.weight for a in group_advantages(rewards))
            feats.extend(_features(s, prompt.weight) for s in group)
            sampled.extend(group)
        if not feats:
            raise RuntimeError("the sampler returned no completion tokens")
        batch = collate(feats, pad_id, device)
        reference = None
        if settings.beta != 0.0:
            with torch.no_grad(), as_reference(model, continued), autocast(device, bf16):
                reference, _rows = token_logps(model, batch)
        if gap is None and spec.engine_url is not None:
            with autocast(device, bf16):
                gap = _gap(sampled, batch, model)
        with autocast(device, bf16):
            loss, tally = step_loss(
                model, batch, sampled, torch.tensor(advantages, device=device), settings, reference
            )
        rewards_curve.append(round(statistics.fmean(step_rewards), 6))
        curves.add(tally, settings.beta)
        tokens += int(batch["attention_mask"].sum())
        samples_seen += len(feats)
        return loss

    plan = Plan(list(range(len(spec.prompts))), spec.batch_size, rng)
    run = train_in_budget(model, optimizer, budget, plan, step, None, progress, spec.fault)
    curve, steps_run, seconds = run.curve, run.steps_run, run.seconds
    if continued:
        model.delete_adapter("reference")
    save_adapter(model, spec.output_dir)
    trained = TrainedModel(model, tokenizer, loaded.eos_token_ids, device, bf16)
    write_fingerprint(trained, spec.prompts, spec.output_dir)
    metrics: dict[str, Any] = {
        "bf16": bf16,
        "loss_curve": curve,
        "reward_curve": rewards_curve,
        **curves.metrics(),
        "mean_reward": rewards_curve[-1],
        "samples": samples_seen,
        "tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_second": round(tokens / seconds, 2) if seconds > 0 else 0.0,
        "load_seconds": round(load_seconds, 4),
        "steps": steps_run,
        "steps_planned": run.report["steps_planned"],
        "stop_reason": run.report["stop_reason"],
        "epochs_run": round(steps_run * spec.batch_size / len(spec.prompts), 3),
        "prompts": len(spec.prompts),
        "sampler": "local" if spec.engine_url is None else "engine",
        "loss_type": settings.loss_type,
        "engine_logprob_gap": gap,
        "device": device.type,
        "continued": continued,
    }
    return TrainResult(adapter_dir=spec.output_dir, metrics=metrics)

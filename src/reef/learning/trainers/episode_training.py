"""RL over episodes: GRPO on whole episodes of an environment, for a LoRA adapter.
Imports torch, transformers and peft: only the training child (``python -m
reef.learning.trainers rl`` with an ``environment`` in its spec) or a test imports it.

Every step takes ``batch_size`` tasks and plays ``group_size`` episodes of each with the
current policy (``reef.environments.play_episodes``). Every request asks for
``logprobs`` and ``return_token_ids``, so each assistant turn comes back as the token
ids its prompt had (the sampler's chat template over the conversation so far, tools
included) and the ids it sampled: nothing is re-tokenized. An episode's reward is the
environment's score; its advantage ``(r - mean) / (std + eps)`` within its task's group
applies to every sampled token of every assistant turn of it. A group whose rewards
are all equal teaches nothing and is left out (no forward pass for it).

The loss is TRL's GRPO objective (``reef.learning.trainers.rl_loss``), an episode
being one sequence: every sampled token of it carries its advantage, ``loss_type``
normalises over the episode's tokens (``grpo``), the step's (``dapo``, ``bnpo``) or a
constant (``dr_grpo``: ``max_new_tokens`` per episode), and the importance ratios are
taken against the log-probs the sampler reported for each turn (the trainer's own,
detached, where it reported none). Groups left out above do not count in the
normalisers (TRL keeps them with advantage 0: the same loss when every group has
signal and ``beta_kl`` is 0).

It is computed ``micro_batch_tokens`` at a time, each micro-batch backwarded on its own
(the weights come from the whole step, so the parts sum to the step's loss exactly), so
a step's memory does not grow with its episodes.

The sampler: without ``engine_url`` the child runs an engine of its own
(:mod:`reef.engine`, on loopback, a second copy of the base model) serving the policy as
the adapter ``policy``, reloaded from the trainer's weights before every step's
episodes: sampling is on-policy at every step, and the engine's token log-probs match
the trainer's at every step (``engine_logprob_gap`` checks it). With
``engine_url`` the episodes are played against that server's ``engine_model``: what it
serves, the policy only until the first update.

An episode the environment could not start or score, or whose model calls failed, is
counted (``episodes_failed``) and left out; a step where more than half fail stops the
run with the first error.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from peft import PeftModel

from reef.core.digests import tree_digest
from reef.environments import (
    ChatEndpoint,
    EpisodeError,
    EpisodeResult,
    Task,
    build_environment,
    run_episodes,
)
from reef.learning.trainers.fingerprint import TrainedModel, write_fingerprint
from reef.learning.trainers.lora_sft import (
    Accumulated,
    Features,
    Plan,
    collate,
    save_adapter,
    set_up,
    token_logps,
    train_in_budget,
)
from reef.learning.trainers.masking import IGNORE_INDEX, sampled_turn
from reef.learning.trainers.precision import autocast, prepare_bf16, use_bf16
from reef.learning.trainers.rl_loss import (
    LossParts,
    LossSettings,
    RatioCurves,
    StepTally,
    clipped_loss,
    group_advantages,
    old_logps,
    sequence_weights,
)
from reef.learning.trainers.rl_policy import as_reference, wrap_policy
from reef.learning.trainers.spec import ProgressCallback, RLSpec, TrainResult

POLICY = "policy"
"""The name the child's own engine serves the policy under."""


def environment_tasks(spec: RLSpec) -> list[Task]:
    """The tasks the run trains on: the environment's, all or the first ``spec.tasks``.
    Raises ``EnvironmentSpecError`` for a bad spec, ``RuntimeError`` when it has none."""
    assert spec.environment is not None
    tasks = build_environment(spec.environment, where="rl.environment").tasks()
    if spec.tasks != "all":
        tasks = tasks[: spec.tasks]
    if not tasks:
        raise RuntimeError("the environment has no tasks to train on")
    return tasks


@dataclass(frozen=True)
class Turn:
    """One assistant turn to train on: its features (prompt and sampled ids, the latter
    labelled), the episode it belongs to (an index into the step's advantages) and the
    sampler's log-probs of its tokens (None when not reported)."""

    features: Features
    episode: int
    sampler_logps: tuple[float, ...] | None


@dataclass
class StepEpisodes:
    """What one step's episodes give the update: the turns of every episode of a group
    with signal, each episode's advantage, and the step's tallies."""

    turns: list[Turn] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    episodes: int = 0
    failed: int = 0
    groups_skipped: int = 0
    model_calls: int = 0
    too_long: int = 0
    stops: Counter[str] = field(default_factory=Counter)
    first_error: str | None = None


def step_episodes(
    groups: Sequence[Sequence[EpisodeResult | EpisodeError]], max_seq_len: int, where: str
) -> StepEpisodes:
    """Turn a step's groups of played episodes (one group per task) into the turns to
    train on, with advantages (the module docstring). Raises ``RuntimeError`` for a
    turn without token ids."""
    out = StepEpisodes()
    for group in groups:
        played: list[EpisodeResult] = []
        for outcome in group:
            if isinstance(outcome, EpisodeError):
                out.failed += 1
                out.first_error = out.first_error or str(outcome)
                continue
            out.model_calls += outcome.turns
            out.stops[outcome.stop] += 1
            if outcome.stop == "error":
                out.failed += 1
                out.first_error = out.first_error or (outcome.error or "the model call failed")
                continue
            played.append(outcome)
        out.episodes += len(played)
        rewards = [episode.score.value for episode in played]
        out.rewards.extend(rewards)
        if len(played) < 2 or len(set(rewards)) == 1:
            out.groups_skipped += 1
            continue
        for episode, advantage in zip(played, group_advantages(rewards), strict=True):
            out.advantages.append(advantage)
            _add_turns(out, episode, len(out.advantages) - 1, max_seq_len, where)
    return out


def _add_turns(
    out: StepEpisodes, episode: EpisodeResult, index: int, max_seq_len: int, where: str
) -> None:
    """Add ``episode``'s turns to ``out`` as the turns of advantage ``index``."""
    for tokens in episode.turn_tokens:
        if tokens is None:
            raise RuntimeError(
                f"the model at {where} reported no token ids for a turn: RL over "
                "episodes needs an engine that returns them (return_token_ids)"
            )
        if not tokens.completion_ids:
            continue
        masked = sampled_turn(tokens.prompt_ids, tokens.completion_ids)
        if len(masked.input_ids) > max_seq_len:
            out.too_long += 1
            continue
        features = Features(masked.input_ids, masked.labels, 1.0)
        out.turns.append(Turn(features, index, tokens.logprobs))


def micro_batches(turns: Sequence[Turn], max_tokens: int) -> Iterator[list[Turn]]:
    """``turns`` in order, cut into batches whose padded size (rows times the longest)
    stays within ``max_tokens`` (a longer turn goes alone)."""
    batch: list[Turn] = []
    width = 0
    for turn in turns:
        length = len(turn.features.input_ids)
        if batch and max(width, length) * (len(batch) + 1) > max_tokens:
            yield batch
            batch, width = [], 0
        batch.append(turn)
        width = max(width, length)
    if batch:
        yield batch


class PolicySampler:
    """Where the episodes are played (the module docstring): the child's own engine,
    synced to the trainer's adapter by :meth:`sync`, or ``spec.engine_url``. The own
    engine holds its weights in bfloat16 when the trainer runs ``bf16``."""

    def __init__(self, spec: RLSpec, work: Path, concurrency: int, bf16: bool = False) -> None:
        self.spec = spec
        self.work = work
        self.concurrency = concurrency
        self.bf16 = bf16
        self.server: Any = None
        self.base_url = ""
        self.model = spec.engine_model or spec.model
        self._synced: Path | None = None

    @property
    def own(self) -> bool:
        """Whether the child serves the policy itself."""
        return self.spec.engine_url is None

    @property
    def name(self) -> str:
        """``local-engine`` or ``engine`` (the metrics' ``sampler``)."""
        return "local-engine" if self.own else "engine"

    def __enter__(self) -> PolicySampler:
        if self.spec.engine_url is not None:
            self.base_url = self.spec.engine_url.rstrip("/").removesuffix("/v1") + "/v1"
            return self
        from reef.engine.models import load_model  # the child's own engine
        from reef.engine.runtime import Engine
        from reef.engine.server import BackgroundServer

        dtype = torch.bfloat16 if self.bf16 else torch.float32
        loaded = load_model(self.spec.model, self.spec.home, dtype)
        engine = Engine(loaded, max_batch=max(self.concurrency, 1), threads=self.spec.threads)
        self.server = BackgroundServer(engine).start()
        self.base_url = self.server.base_url
        self.model = POLICY
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def sync(self, model: PeftModel, number: int) -> None:
        """Serve the trainer's current adapter as the policy (own engine only)."""
        if not self.own:
            return
        directory = self.work / f"policy-{number}"
        save_adapter(model, directory)
        body = {
            "lora_name": POLICY,
            "lora_path": str(directory),
            "expected_digest": tree_digest(directory),
            "load_inplace": True,
        }
        request = urllib.request.Request(  # noqa: S310 (the child's own loopback engine)
            self.base_url + "/load_lora_adapter",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=self.spec.engine_timeout_seconds):  # noqa: S310 (the child's own loopback engine)
            pass
        if self._synced is not None:
            shutil.rmtree(self._synced, ignore_errors=True)
        self._synced = directory

    def play(self, tasks: Sequence[Task], number: int) -> list[list[EpisodeResult | EpisodeError]]:
        """``group_size`` episodes of each task, grouped by task; seeded per step, task
        and episode."""
        spec = self.spec
        assert spec.environment is not None
        jobs = []
        for t, task in enumerate(tasks):
            for g in range(spec.group_size):
                params = {
                    "temperature": spec.temperature,
                    "max_tokens": spec.max_new_tokens,
                    "logprobs": True,
                    "return_token_ids": True,
                    "seed": spec.seed + number * 10_007 + t * 101 + g,
                }
                endpoint = ChatEndpoint(
                    base_url=self.base_url,
                    model=self.model,
                    params=params,
                    timeout_seconds=spec.engine_timeout_seconds,
                )
                jobs.append((task, endpoint))
        played = run_episodes(spec.environment, jobs, self.concurrency, where="rl.environment")
        size = spec.group_size
        return [played[i : i + size] for i in range(0, len(played), size)]


def train_episode_grpo(spec: RLSpec, progress: ProgressCallback | None = None) -> TrainResult:
    """Train a LoRA adapter by GRPO over episodes and save it to ``spec.output_dir``.

    Metrics: ``loss_curve``, ``reward_curve`` (mean episode score of each step, before
    its update), ``success_curve`` (the share of the step's episodes scoring 1),
    ``kl_curve``, ``mean_reward`` (the last step), ``samples`` (episodes played),
    ``tokens`` (tokens trained on), ``model_calls``, ``turns`` (turns trained on),
    ``turns_too_long``, ``groups_skipped``, ``episodes_failed``, ``stops`` (episodes
    by how they ended), ``seconds``, ``load_seconds``, ``steps``, ``tasks``, ``sampler``
    (``local-engine`` or ``engine``), ``loss_type``, ``clip_low_curve``,
    ``clip_high_curve`` and ``ratio_curve`` (``rl_loss.RatioCurves``),
    ``engine_logprob_gap`` (the mean absolute difference of the sampler's and the
    trainer's token log-probs, the worst step's; with ``engine_url``, the first step's
    only), ``device``, ``continued``."""
    tasks = environment_tasks(spec)
    setup = set_up(spec)
    started, device, pad_id = setup.started, setup.device, setup.pad_id
    continued = spec.base_adapter is not None
    model = wrap_policy(setup.loaded.model, spec).to(device)
    bf16 = use_bf16(spec.bf16, device)
    model = prepare_bf16(model, device, bf16)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.lr)
    budget = spec.budget.model_copy(update={"validation_fraction": 0.0})
    concurrency = spec.concurrency or spec.group_size * spec.batch_size
    tally = _Tally()
    update = _Update(model, spec, pad_id, device, bf16)
    work = spec.output_dir.parent / f"{spec.output_dir.name}.policy"
    with PolicySampler(spec, work, concurrency, bf16) as sampler:
        load_seconds = time.monotonic() - started

        def step(items: list[int]) -> Accumulated:
            tally.number += 1
            sampler.sync(model, tally.number)
            groups = sampler.play([tasks[i] for i in items], tally.number)
            played = step_episodes(groups, spec.max_seq_len, sampler.base_url)
            tally.add(played)
            if played.failed * 2 > played.failed + played.episodes:
                raise RuntimeError(
                    f"{played.failed} of the step's episodes failed: {played.first_error}"
                )
            return update.backward(played, tally, sampler.own or tally.number == 1)

        plan = Plan(list(range(len(tasks))), spec.batch_size, setup.rng)
        run = train_in_budget(model, optimizer, budget, plan, step, None, progress, spec.fault)
    if continued:
        model.delete_adapter("reference")
    save_adapter(model, spec.output_dir)
    loaded = setup.loaded  # episodes' prompts vary by play: the built-in probes
    trained = TrainedModel(model, loaded.tokenizer, loaded.eos_token_ids, device, bf16)
    write_fingerprint(trained, [], spec.output_dir)
    metrics: dict[str, Any] = {
        "loss_curve": run.curve,
        **tally.metrics(),
        "seconds": round(run.seconds, 4),
        "load_seconds": round(load_seconds, 4),
        "steps": run.steps_run,
        "steps_planned": run.report["steps_planned"],
        "stop_reason": run.report["stop_reason"],
        "epochs_run": round(run.steps_run * spec.batch_size / len(tasks), 3),
        "tasks": len(tasks),
        "sampler": sampler.name,
        "loss_type": spec.loss_type,
        "device": device.type,
        "bf16": bf16,
        "continued": continued,
    }
    return TrainResult(adapter_dir=spec.output_dir, metrics=metrics)


@dataclass
class _Tally:
    """The run's counts and curves, step by step."""

    number: int = 0
    rewards: list[float] = field(default_factory=list)
    successes: list[float] = field(default_factory=list)
    curves: RatioCurves = field(default_factory=RatioCurves.empty)
    samples: int = 0
    tokens: int = 0
    model_calls: int = 0
    turns: int = 0
    too_long: int = 0
    groups_skipped: int = 0
    failed: int = 0
    stops: Counter[str] = field(default_factory=Counter)
    gaps: list[float] = field(default_factory=list)

    def add(self, played: StepEpisodes) -> None:
        rewards = played.rewards
        self.rewards.append(round(statistics.fmean(rewards), 6) if rewards else 0.0)
        share = sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else 0.0
        self.successes.append(round(share, 6))
        self.samples += played.episodes + played.failed
        self.model_calls += played.model_calls
        self.turns += len(played.turns)
        self.too_long += played.too_long
        self.groups_skipped += played.groups_skipped
        self.failed += played.failed
        self.stops.update(played.stops)

    def metrics(self) -> dict[str, Any]:
        return {
            "reward_curve": self.rewards,
            "success_curve": self.successes,
            **self.curves.metrics(),
            "mean_reward": self.rewards[-1] if self.rewards else 0.0,
            "samples": self.samples,
            "tokens": self.tokens,
            "model_calls": self.model_calls,
            "turns": self.turns,
            "turns_too_long": self.too_long,
            "groups_skipped": self.groups_skipped,
            "episodes_failed": self.failed,
            "stops": dict(self.stops),
            "engine_logprob_gap": round(max(self.gaps), 6) if self.gaps else None,
        }


@dataclass(frozen=True)
class _Update:
    """What a step's update needs besides its episodes."""

    model: PeftModel
    spec: RLSpec
    pad_id: int
    device: torch.device
    bf16: bool = False

    def backward(self, played: StepEpisodes, tally: _Tally, measure_gap: bool) -> Accumulated:
        """Backward the step's loss micro-batch by micro-batch (the module docstring);
        with ``measure_gap`` (the sampler served the weights trained here), the sampler's
        log-probs are compared with the trainer's."""
        settings = LossSettings.of(self.spec)
        if not played.turns:
            tally.curves.add(StepTally(), settings.beta)
            return Accumulated(0.0)
        device = self.device
        owners = [t.episode for t in played.turns]
        counts = [_trained(t) for t in played.turns]
        lengths = torch.zeros(len(played.advantages), device=device)
        lengths.index_add_(
            0,
            torch.tensor(owners, device=device),
            torch.tensor(counts, dtype=torch.float32, device=device),
        )
        scale = sequence_weights(settings, lengths)
        advantages = torch.tensor(played.advantages, device=device)
        total = 0.0
        step = StepTally()
        gaps: list[float] = []
        for chunk in micro_batches(played.turns, self.spec.micro_batch_tokens):
            loss, parts, policy = self._chunk(chunk, settings, advantages, scale)
            loss.backward()  # type: ignore[no-untyped-call]
            total += float(loss.detach())
            step.add(parts)
            if measure_gap:
                gaps.extend(_gaps(chunk, policy))
        tally.tokens += sum(counts)
        tally.curves.add(step, settings.beta)
        if gaps:
            tally.gaps.append(statistics.fmean(gaps))
        return Accumulated(total)

    def _chunk(
        self,
        chunk: Sequence[Turn],
        settings: LossSettings,
        advantages: torch.Tensor,
        scale: torch.Tensor,
    ) -> tuple[torch.Tensor, LossParts, torch.Tensor]:
        """One micro-batch's share of the step's loss, its parts and its log-probs."""
        model, device = self.model, self.device
        batch = collate([t.features for t in chunk], self.pad_id, device)
        reference = None
        if settings.beta != 0.0:
            continued = self.spec.base_adapter is not None
            with torch.no_grad(), as_reference(model, continued), autocast(device, self.bf16):
                reference, _ = token_logps(model, batch)
        with autocast(device, self.bf16):
            policy, rows = token_logps(model, batch)
            old = old_logps(policy, [(_trained(t), t.sampler_logps) for t in chunk])
            owner = torch.tensor([t.episode for t in chunk], device=device)[rows]
            parts = clipped_loss(settings, policy, old, reference, advantages[owner], scale[owner])
        return parts.loss, parts, policy


def _trained(turn: Turn) -> int:
    """How many of the turn's tokens train (its labelled ones)."""
    return len(turn.features.labels) - turn.features.labels.count(IGNORE_INDEX)


def _gaps(chunk: Sequence[Turn], policy: torch.Tensor) -> list[float]:
    """|sampler - trainer| log-prob per token, when every turn of the chunk reported its
    log-probs (``policy`` is flat, turn by turn, in order)."""
    sampler = [lp for t in chunk for lp in (t.sampler_logps or ())]
    if any(t.sampler_logps is None for t in chunk) or len(sampler) != policy.numel():
        return []
    ours = policy.detach().cpu().tolist()
    return [abs(a - b) for a, b in zip(sampler, ours, strict=True)]

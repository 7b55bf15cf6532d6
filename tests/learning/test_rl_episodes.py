"""``rl`` over episodes (``reef.learning.trainers.episode_training``): a step's episodes become
turns with their episode's advantage; micro-batches give the whole batch's gradient;
on tiny-random in the ``python`` environment, GRPO over episodes sampled through the
child's own engine raises the episode success rate, with the engine serving exactly
the weights being trained; the learner end to end in the child and as a Ray task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reef.core import SilentProgress
from reef.core.digests import tree_digest
from reef.environments import EpisodeError, EpisodeResult, Score, TurnTokens
from reef.learning.base import ExperienceBatch, LearnerContext, MetricLog
from reef.learning.learners.rl import RLConfig, RLLearner
from reef.learning.trainers import Budget
from reef.learning.trainers.spec import LoraSettings, RLSpec
from reef.releases import (
    ModelComponent,
    ReleaseChain,
    ReleaseManifest,
    open_artifact_store,
    read_fingerprint,
)
from tests.fakes.learning import ScriptedReflector

# PEFT 0.21 reads a deprecated transformers property while wrapping a model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)

TINY = "tiny-random"
QUESTIONS = ["Hi?", "Sky?", "Fruit?", "Count."]
LORA = LoraSettings(target_modules=["q_proj", "v_proj", "lm_head"])


def write_tasks(path: Path) -> Path:
    """Tasks of the ``orders`` toolset whose check is that the final answer holds an
    "a": rare in tiny-random's first answers (~30% of 32 tokens), so there is signal."""
    rows = [
        {"id": f"t{i}", "messages": [{"role": "user", "content": q}], "expected": {}}
        for i, q in enumerate(QUESTIONS)
    ]
    for row in rows:
        row["expected"] = {"answer_contains": ["a"]}
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def environment(tmp_path: Path) -> dict[str, Any]:
    return {"type": "python", "toolset": "orders", "tasks": str(write_tasks(tmp_path / "t.jsonl"))}


def spec_for(tmp_path: Path, steps: int, **changes: Any) -> RLSpec:
    fields: dict[str, Any] = {
        "model": TINY,
        "home": tmp_path / "home",
        "environment": environment(tmp_path),
        "output_dir": tmp_path / "adapter",
        "lora": LORA,
        "group_size": 8,
        "max_new_tokens": 32,
        "lr": 2e-2,
        "beta_kl": 0.01,
        "budget": Budget(steps=steps),
        "batch_size": 4,
        "max_seq_len": 2048,
        "threads": 1,
        # float32 whatever the CPU: the engine's log-probs are then exactly the trainer's
        # (bf16 episodes: tests/learning/test_precision.py)
        "bf16": False,
    }
    return RLSpec(**{**fields, **changes})


def episode(score: float, turns: list[TurnTokens | None], stop: str = "finished") -> EpisodeResult:
    return EpisodeResult(
        task_id="t",
        environment="python",
        session_id="s",
        stop=stop,  # type: ignore[arg-type]
        score=Score(score, "r"),
        turns=len(turns),
        tool_calls=0,
        tool_status={},
        truncated=0,
        seconds=0.0,
        messages=(),
        error="boom" if stop == "error" else None,
        turn_tokens=tuple(turns),
    )


def tokens(prompt: int, completion: int) -> TurnTokens:
    return TurnTokens(tuple(range(1, prompt + 1)), tuple(range(5, 5 + completion)))


def test_step_episodes_turn_every_turn_of_an_episode_into_its_advantage() -> None:
    from reef.learning.trainers.episode_training import step_episodes

    two_turns = [tokens(6, 3), tokens(12, 2)]
    signal = [episode(1.0, two_turns), episode(0.0, two_turns), episode(0.0, [tokens(6, 4)])]
    flat = [episode(0.0, [tokens(6, 3)]), episode(0.0, [tokens(6, 3)])]
    failing = [
        episode(1.0, [tokens(6, 3)]),
        EpisodeError("the worker did not start"),
        episode(0.0, [tokens(6, 3)], stop="error"),
        episode(0.0, [tokens(60, 3)]),  # longer than max_seq_len: left out, counted
    ]
    out = step_episodes([signal, flat, failing], max_seq_len=40, where="http://x")
    assert out.episodes == 3 + 2 + 2 and out.failed == 2
    assert out.first_error == "the worker did not start"
    assert out.groups_skipped == 1  # the flat group teaches nothing
    assert out.too_long == 1 and out.model_calls == (2 + 2 + 1) + (1 + 1) + (1 + 1 + 1)
    # Every turn carries its episode's advantage: 2 + 2 + 1 turns of group one, 1 of three.
    owners = [turn.episode for turn in out.turns]
    assert owners == [0, 0, 1, 1, 2, 3]
    first, second = out.advantages[0], out.advantages[1]
    assert first > 0 > second and out.advantages[1] == pytest.approx(out.advantages[2])
    assert out.advantages[3] > 0 > out.advantages[4]
    # Prompt ids are unlabelled, sampled ids labelled, exactly as the engine gave them.
    turn = out.turns[1]
    assert turn.features.input_ids == [*range(1, 13), 5, 6]
    assert turn.features.labels == [-100] * 12 + [5, 6]
    assert out.stops == {"finished": 7, "error": 1}

    with pytest.raises(RuntimeError, match="return_token_ids"):
        step_episodes([[episode(1.0, [None]), episode(0.0, [None])]], 40, "http://x")


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "sequence_sum"])
def test_micro_batches_give_the_whole_batch_gradient(tmp_path: Path, loss_type: str) -> None:
    """The step's loss backwarded in small micro-batches leaves the same gradients as
    one pass over every turn, whatever the loss type's normalisation."""
    import torch

    from reef.learning.trainers.episode_training import (
        StepEpisodes,
        Turn,
        _Tally,
        _Update,
        micro_batches,
    )
    from reef.learning.trainers.lora_sft import Features, set_up
    from reef.learning.trainers.rl_policy import wrap_policy

    spec = spec_for(tmp_path, 1, loss_type=loss_type)
    setup = set_up(spec)
    model = wrap_policy(setup.loaded.model, spec)
    played = StepEpisodes(advantages=[1.2, -0.7, 0.4], episodes=4)
    for index, (prompt, completion) in enumerate([(5, 3), (9, 4), (7, 2), (11, 5), (6, 6)]):
        ids = [(7 * index + k) % 200 + 3 for k in range(prompt + completion)]
        labels = [-100] * prompt + ids[prompt:]
        played.turns.append(Turn(Features(ids, labels, 1.0), index % 3, None))
    assert len(list(micro_batches(played.turns, 20))) == 5
    assert len(list(micro_batches(played.turns, 10_000))) == 1

    def gradients(max_tokens: int) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        update = _Update(
            model, spec.model_copy(update={"micro_batch_tokens": max_tokens}), 0, setup.device
        )
        loss = update.backward(played, _Tally(), measure_gap=False).loss
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return loss, grads

    whole_loss, whole = gradients(10_000)
    parts_loss, parts = gradients(64)
    assert whole and whole.keys() == parts.keys()
    assert parts_loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-6)
    for name, grad in whole.items():
        torch.testing.assert_close(parts[name], grad, rtol=1e-4, atol=1e-6)


def test_the_update_takes_ratios_against_the_sampler_s_log_probs(tmp_path: Path) -> None:
    """A turn's recorded log-probs are the old policy's: a sampler whose log-probs are
    the trainer's moved by 0.5 gives ratios of exactly exp(0.5) and exp(-0.5), clipped
    on the advantage's side; turns without them are on-policy (ratio 1)."""
    import math

    import torch

    from reef.learning.trainers.episode_training import StepEpisodes, Turn, _Tally, _Update
    from reef.learning.trainers.lora_sft import Features, collate, set_up, token_logps
    from reef.learning.trainers.rl_policy import wrap_policy

    spec = spec_for(tmp_path, 1, beta_kl=0.0)
    setup = set_up(spec)
    model = wrap_policy(setup.loaded.model, spec)
    features = []
    for index, (prompt, completion) in enumerate([(5, 3), (7, 4)]):
        ids = [(5 * index + k) % 200 + 3 for k in range(prompt + completion)]
        features.append(Features(ids, [-100] * prompt + ids[prompt:], 1.0))
    with torch.no_grad():
        policy, rows = token_logps(model, collate(features, 0, setup.device))
    own = [policy[rows == row].tolist() for row in range(2)]

    def ratios(shifts: tuple[float | None, float | None]) -> tuple[list[float], _Tally]:
        played = StepEpisodes(advantages=[1.0, -1.0], episodes=2)
        for index, shift in enumerate(shifts):
            recorded = None if shift is None else tuple(lp - shift for lp in own[index])
            played.turns.append(Turn(features[index], index, recorded))
        tally = _Tally()
        model.zero_grad(set_to_none=True)
        _Update(model, spec, 0, setup.device).backward(played, tally, measure_gap=False)
        return tally.curves.ratio[0], tally

    on_policy, tally = ratios((None, None))
    assert on_policy == [1.0, 1.0, 1.0] and tally.curves.clip_high == [0.0]
    stale, tally = ratios((0.5, -0.5))  # A > 0 pushed up, A < 0 pushed down
    assert stale[0] == pytest.approx(math.exp(-0.5), rel=1e-5)
    assert stale[2] == pytest.approx(math.exp(0.5), rel=1e-5)
    # Every token is out of range on its advantage's side: 3 clipped high, 4 low.
    assert tally.curves.clip_high == [round(3 / 7, 6)]
    assert tally.curves.clip_low == [round(4 / 7, 6)]
    assert tally.curves.kl == []  # beta 0: no reference pass


def test_rl_over_episodes_raises_the_success_rate(tmp_path: Path) -> None:
    from reef.learning.trainers.grpo import train_grpo

    result = train_grpo(spec_for(tmp_path, 8))
    metrics = result.metrics
    success = metrics["success_curve"]
    assert metrics["sampler"] == "local-engine" and len(success) == 8
    assert success[0] < 0.45, success
    assert sum(success[-3:]) / 3 > success[0] + 0.3, success
    # Every step's episodes were played against the weights being trained: the engine's
    # log-probs of what it sampled are the trainer's.
    assert metrics["engine_logprob_gap"] is not None and metrics["engine_logprob_gap"] < 1e-4
    assert metrics["samples"] == 8 * 4 * 8 and metrics["episodes_failed"] == 0
    assert metrics["model_calls"] >= metrics["samples"] and metrics["turns"] > 0
    assert sum(metrics["stops"].values()) == metrics["samples"]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert read_fingerprint(tmp_path / "adapter") is not None  # on the built-in probes
    assert not (tmp_path / "adapter.policy").exists()  # the synced copies are gone


def test_rl_specs_take_prompts_or_an_environment(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        RLSpec(model=TINY, home=tmp_path, output_dir=tmp_path / "a")
    with pytest.raises(ValueError, match="unknown environment type 'nope'"):
        RLConfig(environment={"type": "nope"})
    with pytest.raises(ValueError, match="toolset"):
        RLConfig(environment={"type": "python"})
    with pytest.raises(ValueError, match="at least 1"):
        RLConfig(environment=environment(tmp_path), tasks=0)


@pytest.fixture
def chain(tmp_path: Path) -> Any:
    opened = ReleaseChain.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    yield opened
    opened.close()


def learner_context(tmp_path: Path, chain: ReleaseChain, name: str) -> LearnerContext:
    head = chain.create(
        name, ReleaseManifest(model=ModelComponent(base=TINY)), actor="test", reason="test"
    )
    return LearnerContext(
        scenario=name,
        head=head,
        batch=ExperienceBatch(train=[], holdout=[]),
        artifacts=open_artifact_store(tmp_path / "artifacts"),
        home=tmp_path / "home",
        work_dir=tmp_path / f"work-{name}",
        reflector=ScriptedReflector(),
        progress=SilentProgress(),
        metrics=MetricLog(),
    )


SMALL: dict[str, Any] = {
    "target_modules": ["q_proj", "v_proj"],
    "group_size": 2,
    "max_new_tokens": 8,
    "batch_size": 2,
    "max_seq_len": 2048,
    "steps": 2,
    "threads": 1,
}


@pytest.mark.parametrize("trainer", ["local", "ray"])
def test_the_learner_trains_on_episodes_in_the_child_or_on_ray(
    tmp_path: Path, chain: ReleaseChain, trainer: str
) -> None:
    """No experience needed: the environment's tasks are the data; the adapter is stored
    by digest and the metrics say how the episodes went."""
    if trainer == "ray":
        pytest.importorskip("ray")
    learner = RLLearner(RLConfig(environment=environment(tmp_path), trainer=trainer, **SMALL))
    context = learner_context(tmp_path, chain, "s")
    output = learner.learn(context)
    assert output.adapter is not None and output.consumed == []
    assert tree_digest(context.artifacts.materialize(output.adapter)) == output.adapter
    metrics = output.metrics
    assert metrics["environment"] == "python" and metrics["tasks"] == 4
    assert metrics["samples"] == 2 * 2 * 2 and len(metrics["success_curve"]) == 2
    assert metrics["sampler"] == "local-engine" and metrics["episodes_failed"] == 0

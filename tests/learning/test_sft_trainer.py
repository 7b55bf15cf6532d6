"""The LoRA SFT trainer on tiny-random: the label mask, that it learns, determinism,
and that a failing training child fails the call and never this process."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel

from reef.core.digests import tree_digest
from reef.engine.models import LoadedModel, load_model
from reef.learning.trainers import (
    Budget,
    LoraSettings,
    SFTExample,
    SFTSpec,
    TrainingFailedError,
    run_in_child,
)
from reef.learning.trainers.lora_sft import IGNORE_INDEX, build_features, train_lora_sft

# PEFT 0.21 reads a deprecated transformers property while wrapping a model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)

TINY = "tiny-random"
TARGET = "Squid-7"
PROMPTS = [
    "What colour is the sky?",
    "Name a fruit.",
    "Say hi.",
    "Count to three.",
    "Best pet?",
    "Opposite of up?",
    "A number?",
    "Capital of France?",
]


def examples(target: str = TARGET) -> list[SFTExample]:
    return [SFTExample(messages=[{"role": "user", "content": p}], target=target) for p in PROMPTS]


def spec(tmp_path: Path, **changes: object) -> SFTSpec:
    base = SFTSpec(
        model=TINY,
        home=tmp_path / "home",
        examples=examples(),
        output_dir=tmp_path / "adapter",
        lora=LoraSettings(target_modules=["q_proj", "v_proj", "lm_head"]),
        lr=1e-2,
        budget=Budget(steps=60),
        batch_size=8,
        threads=1,
        # float32 whatever the CPU: these tests compare greedy answers of a random tiny
        # model, which bf16 rounding can tip (bf16 runs: tests/learning/test_precision.py)
        bf16=False,
    )
    return base.model_copy(update=changes)


def hits(loaded: LoadedModel, model: torch.nn.Module, prompts: list[str] = PROMPTS) -> int:
    """How many ``prompts`` greedy decoding answers with exactly TARGET."""
    tokenizer, count = loaded.tokenizer, 0
    for prompt in prompts:
        ids: torch.Tensor = tokenizer.apply_chat_template(  # type: ignore[assignment]
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=False,
        )
        out = model.generate(  # type: ignore[operator]
            ids, max_new_tokens=len(TARGET) + 1, do_sample=False, pad_token_id=0
        )
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        count += text == TARGET
    return count


def test_loss_counts_only_the_assistant_reply(tmp_path: Path) -> None:
    tokenizer = load_model(TINY, tmp_path).tokenizer
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Name?"},
    ]
    features = build_features(tokenizer, SFTExample(messages=conversation, target="Reef"), 512)
    prompt = tokenizer.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert features.input_ids[: len(prompt)] == list(prompt)
    assert features.labels[: len(prompt)] == [IGNORE_INDEX] * len(prompt)
    answer = features.labels[len(prompt) :]
    assert IGNORE_INDEX not in answer
    assert answer == features.input_ids[len(prompt) :]
    assert tokenizer.decode(answer) == "Reef<|im_end|>"  # not the newline after it

    short = build_features(tokenizer, SFTExample(messages=conversation, target="Reef"), 12)
    assert len(short.input_ids) == 12
    assert tokenizer.decode([t for t in short.labels if t != IGNORE_INDEX]) == "Reef<|im_end|>"


def test_training_makes_the_model_say_the_targets(tmp_path: Path) -> None:
    result = train_lora_sft(spec(tmp_path))
    curve = result.metrics["loss_curve"]
    assert len(curve) == 60 and curve[-1] < curve[0] / 2
    assert result.metrics["tokens"] > 0 and result.metrics["tokens_per_second"] > 0
    assert sorted(p.name for p in result.adapter_dir.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "reef-fingerprint.json",
    ]
    base = load_model(TINY, tmp_path)
    assert hits(base, base.model) == 0
    tuned = load_model(TINY, tmp_path)
    assert hits(tuned, PeftModel.from_pretrained(tuned.model, str(result.adapter_dir))) >= 6


def test_same_seed_same_adapter(tmp_path: Path) -> None:
    first = train_lora_sft(spec(tmp_path, budget=Budget(steps=3), output_dir=tmp_path / "a"))
    second = train_lora_sft(spec(tmp_path, budget=Budget(steps=3), output_dir=tmp_path / "b"))
    other = train_lora_sft(
        spec(tmp_path, budget=Budget(steps=3), output_dir=tmp_path / "c", seed=1)
    )
    assert first.metrics["loss_curve"] == second.metrics["loss_curve"]
    assert tree_digest(first.adapter_dir) == tree_digest(second.adapter_dir)
    assert tree_digest(first.adapter_dir) != tree_digest(other.adapter_dir)


def test_a_child_killed_by_a_signal_fails_the_call_not_the_parent(tmp_path: Path) -> None:
    steps: list[int] = []
    with pytest.raises(TrainingFailedError) as caught:
        run_in_child(
            spec(tmp_path, fault="abort"),
            lambda step, _steps, _loss: steps.append(step),
            work_dir=tmp_path / "work",
        )
    assert caught.value.exit_status == -signal.SIGABRT
    assert "killed by signal" in caught.value.message
    assert steps == [1]
    assert not (tmp_path / "adapter").exists()
    assert os.getpid() > 0  # still here


def test_a_child_that_raises_fails_with_its_log_tail(tmp_path: Path) -> None:
    bad = spec(tmp_path, lora=LoraSettings(target_modules=["no_such_module"]))
    with pytest.raises(TrainingFailedError) as caught:
        run_in_child(bad, work_dir=tmp_path / "work")
    assert caught.value.exit_status == 1
    assert "no_such_module" in caught.value.log_tail
    assert "no_such_module" in (tmp_path / "work" / "train.log").read_text()


def test_a_child_past_its_timeout_is_killed(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError) as caught:
        run_in_child(spec(tmp_path), work_dir=tmp_path / "work", timeout_seconds=0.2)
    assert caught.value.exit_status is None
    assert "timed out" in caught.value.message


def test_epochs_stop_early_on_a_task_it_can_fit(tmp_path: Path) -> None:
    many = [
        SFTExample(
            messages=[{"role": "user", "content": f"which code for case {i}?"}], target=TARGET
        )
        for i in range(40)
    ]
    # A random tiny model plateaus for a few epochs before it breaks through: patience.
    budget = Budget(epochs=100, patience=10)
    result = train_lora_sft(spec(tmp_path, examples=many, budget=budget))
    metrics = result.metrics
    assert metrics["stop_reason"] == "early_stopped"
    assert metrics["steps"] < metrics["steps_planned"] == 500
    assert (metrics["train_examples"], metrics["val_examples"]) == (36, 4)
    assert metrics["undertrained"] is False
    losses = [loss for _, loss in metrics["val_curve"]]
    assert losses[-1] >= min(losses)  # patience ran out on a plateau
    assert metrics["best_val_loss"] == min(losses) < losses[0] / 10
    # The weights kept are the best step's, whatever came after it: they answer the
    # task's prompts, held-out ones included (how a random tiny model answers prompts of
    # another kind is left to chance).
    loaded = load_model(TINY, tmp_path / "home")
    tuned = PeftModel.from_pretrained(loaded.model, str(result.adapter_dir))
    asked = [str(example.messages[0]["content"]) for example in many] + ["which code for case 77?"]
    assert hits(loaded, tuned, asked) == len(asked)


def test_a_run_that_starts_knowing_its_examples_makes_one_pass_and_a_new_one_its_epochs(
    tmp_path: Path,
) -> None:
    learned = Budget(epochs=200, validation_fraction=0, fitted_loss=0.01)
    assert train_lora_sft(spec(tmp_path, budget=learned)).metrics["stop_reason"] == "fitted"
    budget = Budget(epochs=3, validation_fraction=0, known_loss=0.05)

    def run(name: str, **changes: object) -> dict[str, Any]:
        changed = spec(tmp_path, budget=budget, batch_size=2, output_dir=tmp_path / name, **changes)
        return train_lora_sft(changed).metrics

    # Continuing from that adapter on what it already answers: one pass (4 steps of 2),
    # every example trained on once, then `known` instead of three passes (the agent
    # quickstart's second round, docs/training.md).
    again = run("next", base_adapter=tmp_path / "adapter")
    assert (again["stop_reason"], again["steps"], again["steps_planned"]) == ("known", 4, 12)
    assert sum(again["loss_curve"]) / 4 <= 0.05
    loaded = load_model(TINY, tmp_path / "home")
    assert hits(loaded, PeftModel.from_pretrained(loaded.model, str(tmp_path / "next"))) == 8
    # A fresh adapter learning the same examples, or the learned one a new target: the
    # first pass is learning, so every pass runs.
    fresh = run("fresh")
    assert (fresh["stop_reason"], fresh["steps"]) == ("completed", 12)
    assert sum(fresh["loss_curve"][:4]) / 4 > 0.05
    other = run("other", base_adapter=tmp_path / "adapter", examples=examples("Kraken-9"))
    assert (other["stop_reason"], other["steps"]) == ("completed", 12)


def test_a_time_cap_stops_a_run_and_says_so(tmp_path: Path) -> None:
    many = [
        SFTExample(messages=[{"role": "user", "content": f"question {i}?"}], target=f"answer {i}")
        for i in range(40)
    ]
    budget = Budget(epochs=1000, max_seconds=0.5, patience=1000)
    metrics = train_lora_sft(spec(tmp_path, examples=many, budget=budget)).metrics
    assert metrics["stop_reason"] == "max_seconds"
    assert 0 < metrics["steps"] < metrics["steps_planned"]
    # the loop's CPU time is reported beside its wall time (one thread: never above it
    # by more than the clocks' granularity)
    assert 0 < metrics["cpu_seconds"] <= metrics["seconds"] * 1.5 + 0.05


def test_a_run_stops_once_its_examples_are_learned_and_a_learned_start_stops_at_once(
    tmp_path: Path,
) -> None:
    budget = Budget(epochs=200, validation_fraction=0, fitted_loss=0.01)
    first = train_lora_sft(spec(tmp_path, budget=budget)).metrics
    assert first["stop_reason"] == "fitted"
    assert 8 <= first["steps"] < first["steps_planned"] == 200
    assert sum(first["loss_curve"][-8:]) / 8 <= 0.01 < first["loss_curve"][0]
    # Continuing from that adapter on the same examples: nothing left to learn, so the
    # run stops after one window of steps instead of its 200 (the agent quickstart's
    # second round, docs/benchmarks.md).
    again = spec(
        tmp_path, budget=budget, base_adapter=tmp_path / "adapter", output_dir=tmp_path / "next"
    )
    second = train_lora_sft(again).metrics
    assert (second["stop_reason"], second["steps"]) == ("fitted", 8)
    loaded = load_model(TINY, tmp_path / "home")
    assert hits(loaded, PeftModel.from_pretrained(loaded.model, str(tmp_path / "next"))) == 8
    # An exact step count is a reproduction: it runs every step whatever the loss.
    exact = budget.model_copy(update={"steps": 12})
    third = train_lora_sft(spec(tmp_path, budget=exact, output_dir=tmp_path / "exact")).metrics
    assert (third["stop_reason"], third["steps"]) == ("steps", 12)

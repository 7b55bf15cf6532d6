"""The LoRA preference trainer on tiny-random: DPO raises the chosen reply's log-prob
margin over the rejected one, KTO raises the desirable replies' log-ratio, and both
run in the training child."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel

from reef.core.digests import tree_digest
from reef.engine.models import load_model
from reef.learning.trainers import Budget
from reef.learning.trainers.lora_sft import build_features, collate, wrap_lora
from reef.learning.trainers.preference import (
    batch_objective,
    dpo_loss,
    kl_estimate,
    kto_loss,
    prepare,
    sequence_logps,
    train_preference,
)
from reef.learning.trainers.runner import run_in_child
from reef.learning.trainers.spec import (
    LoraSettings,
    PreferencePair,
    PreferenceSpec,
    SFTExample,
    UnpairedExample,
)
from reef.releases import read_fingerprint

# PEFT 0.21 reads a deprecated transformers property while wrapping a model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)

TINY = "tiny-random"
GOOD, BAD = "Squid-7", "Octo-3"
PROMPTS = ["What colour is the sky?", "Name a fruit.", "Say hi.", "Count to three."]


def user(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def spec(tmp_path: Path, **changes: object) -> PreferenceSpec:
    base = PreferenceSpec(
        objective="dpo",
        model=TINY,
        home=tmp_path / "home",
        pairs=[PreferencePair(messages=user(p), chosen=GOOD, rejected=BAD) for p in PROMPTS],
        examples=[
            UnpairedExample(messages=user(p), target=t, desirable=t == GOOD)
            for p in PROMPTS
            for t in (GOOD, BAD)
        ],
        output_dir=tmp_path / "adapter",
        lora=LoraSettings(target_modules=["q_proj", "v_proj", "lm_head"]),
        lr=1e-2,
        budget=Budget(steps=12),
        batch_size=4,
        threads=1,
    )
    return base.model_copy(update=changes)


def logps(tmp_path: Path, adapter: Path, reply: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(before, after): log-probs of ``reply`` to every prompt under the base model and
    under the trained adapter, measured with PEFT directly."""
    loaded = load_model(TINY, tmp_path / "home")
    model = PeftModel.from_pretrained(loaded.model, str(adapter)).eval()
    feats = [
        build_features(loaded.tokenizer, SFTExample(messages=user(p), target=reply), 512)
        for p in PROMPTS
    ]
    batch = collate(feats, 0, torch.device("cpu"))
    with torch.no_grad():
        after = sequence_logps(model, batch)
        with model.disable_adapter():
            before = sequence_logps(model, batch)
    return before, after


def test_losses_match_their_formulas() -> None:
    one = torch.ones(1)
    loss, chosen, rejected = dpo_loss(torch.tensor([1.0]), torch.tensor([-1.0]), 0.5, one)
    assert float(chosen) == pytest.approx(0.5) and float(rejected) == pytest.approx(-0.5)
    assert float(loss) == pytest.approx(-float(torch.nn.functional.logsigmoid(torch.tensor(1.0))))
    hinge, _, _ = dpo_loss(torch.tensor([1.0]), torch.tensor([-1.0]), 0.25, one, "hinge")
    assert float(hinge) == pytest.approx(0.5)  # relu(1 - 0.25 * 2)
    lengths = (torch.tensor([2.0]), torch.tensor([4.0]))
    ipo, _, _ = dpo_loss(torch.tensor([1.0]), torch.tensor([-2.0]), 0.5, one, "ipo", lengths)
    assert float(ipo) == pytest.approx(0.0)  # 1/2 + 2/4 - 1/(2 * 0.5)
    with pytest.raises(ValueError, match="token counts"):
        dpo_loss(torch.tensor([1.0]), torch.tensor([-2.0]), 0.5, one, "ipo")
    kl = kl_estimate(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -2.0]))
    assert float(kl) == 0.0  # mean logratio 0
    kl = kl_estimate(torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.0]))
    assert float(kl) == pytest.approx(0.5)
    assert float(kl_estimate(torch.zeros(0), torch.zeros(0))) == 0.0
    kto, rewards = kto_loss(
        torch.tensor([0.5, 0.5]), torch.tensor([True, False]), 1.0, torch.ones(2), kl, (2.0, 1.0)
    )
    assert rewards.tolist() == pytest.approx([0.5, 0.5])
    assert float(kto) == pytest.approx(0.75)  # (2 * (1 - sigmoid(0)) + (1 - sigmoid(0))) / 2


def test_dpo_raises_the_chosen_margin(tmp_path: Path) -> None:
    result = train_preference(spec(tmp_path))
    metrics = result.metrics
    assert len(metrics["loss_curve"]) == 12 and metrics["tokens"] > 0
    assert metrics["loss_curve"][-1] < metrics["loss_curve"][0]
    assert metrics["reward_accuracy"] >= 0.75 and metrics["reward_margin"] > 0
    assert sorted(p.name for p in result.adapter_dir.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "reef-fingerprint.json",  # what staging verifies the served weights against
    ]
    fingerprint = read_fingerprint(result.adapter_dir)
    assert fingerprint is not None and fingerprint.probes[0].messages == user(PROMPTS[0])
    good_before, good_after = logps(tmp_path, result.adapter_dir, GOOD)
    bad_before, bad_after = logps(tmp_path, result.adapter_dir, BAD)
    before, after = good_before - bad_before, good_after - bad_after
    assert float(after.mean()) > float(before.mean()) + 1.0
    assert float(((after - before) > 0).float().mean()) >= 0.75


def test_kto_raises_the_desirable_log_ratio(tmp_path: Path) -> None:
    result = train_preference(spec(tmp_path, objective="kto", lr=2e-2))
    assert result.metrics["objective"] == "kto" and len(result.metrics["loss_curve"]) == 12
    # The reference point is an estimate, clamped at 0, that moves as the policy does.
    kls = result.metrics["kl_curve"]
    assert len(kls) == 12 and min(kls) >= 0.0 and max(kls) > 0.0
    good_before, good_after = logps(tmp_path, result.adapter_dir, GOOD)
    assert float((good_after - good_before).mean()) > 0
    bad_before, bad_after = logps(tmp_path, result.adapter_dir, BAD)
    assert float((good_after - good_before).mean()) > float((bad_after - bad_before).mean())


def test_runs_in_the_child_and_continues_from_an_adapter(tmp_path: Path) -> None:
    seen: list[int] = []
    first = run_in_child(
        spec(tmp_path, budget=Budget(steps=2)),
        lambda step, _steps, _loss: seen.append(step),
        work_dir=tmp_path / "work",
    )
    assert seen == [1, 2] and first.metrics["continued"] is False
    again = run_in_child(
        spec(
            tmp_path,
            budget=Budget(steps=2),
            base_adapter=first.adapter_dir,
            output_dir=tmp_path / "b",
        ),
        work_dir=tmp_path / "work2",
    )
    assert again.metrics["continued"] is True
    # Continuing starts at the reference: the first step's margin is zero.
    assert again.metrics["margin_curve"][0] == pytest.approx(0.0, abs=1e-4)
    assert tree_digest(again.adapter_dir) != tree_digest(first.adapter_dir)


def test_kto_mismatched_sequences_that_do_not_fit_leave_the_estimate(tmp_path: Path) -> None:
    """Example 0's prompt with example 1's long reply is over ``max_seq_len`` (each alone
    fits): the estimate uses the one mismatched sequence left; a lone example has none
    and its reference point is 0."""
    long_prompt, long_reply = "Tell me " + "x" * 60, "y" * 60
    examples = [
        UnpairedExample(messages=user(long_prompt), target=GOOD, desirable=True),
        UnpairedExample(messages=user("Hi."), target=long_reply, desirable=False),
    ]
    run = spec(tmp_path, objective="kto", examples=examples, max_seq_len=110)
    loaded = load_model(TINY, run.home)
    model = wrap_lora(loaded.model, None, run.lora)
    data = prepare(model, loaded.tokenizer, run, 0, torch.device("cpu"))
    assert data.skipped == [] and data.mismatched[0] is None and data.mismatched[1] is not None
    out = batch_objective(model, data, [0, 1], run, 0, torch.device("cpu"))
    assert out.kl == 0.0  # the fresh adapter is the reference: the one logratio is 0
    assert torch.isfinite(out.loss)
    alone = spec(tmp_path, objective="kto", examples=examples[:1])
    data = prepare(model, loaded.tokenizer, alone, 0, torch.device("cpu"))
    assert data.mismatched == [None]
    assert batch_objective(model, data, [0], alone, 0, torch.device("cpu")).kl == 0.0

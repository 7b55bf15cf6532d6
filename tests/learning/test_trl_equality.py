"""Reef's DPO and KTO losses equal TRL's: on one tiny-random LoRA model, one batch and
one reference (the base, the adapter disabled), Reef's training-step objective
(``batch_objective``) and TRL 1.16's own ``DPOTrainer.compute_loss`` /
``KTOTrainer.compute_loss`` give the same loss within 1e-5 and the same LoRA gradients
within 1e-4 relative, for each loss type a recipe can select.

The adapter is set to seeded random weights first, so the policy differs from the
reference and every term of each loss is live. The shared system prompt is long enough
for Reef's prefix sharing (``decoder_states``) to run once per batch."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel
from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

from reef.engine.models import LoadedModel, load_model
from reef.learning.trainers.lora_sft import IGNORE_INDEX, collate, wrap_lora
from reef.learning.trainers.preference import Prepared, batch_objective, prepare
from reef.learning.trainers.spec import (
    DpoLossType,
    LoraSettings,
    PreferencePair,
    PreferenceSpec,
    UnpairedExample,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

TINY = "tiny-random"
SYSTEM = "You answer questions about the reef in one short line, politely and exactly."
PROMPTS = ["What colour is the sky?", "Name a fruit.", "Say hi.", "Count to three."]
REPLIES = [("Blue.", "It is green, of course."), ("Apple", "No."), ("Hi!", "Bye"), ("1 2 3", "3")]
LOSS_TOL, GRAD_TOL = 1e-5, 1e-4
CPU = torch.device("cpu")


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def pairs() -> list[PreferencePair]:
    return [
        PreferencePair(messages=messages(p), chosen=good, rejected=bad)
        for p, (good, bad) in zip(PROMPTS, REPLIES, strict=True)
    ]


def examples() -> list[UnpairedExample]:
    # Desirable and undesirable interleaved, with replies of different lengths.
    return [
        UnpairedExample(messages=messages(p), target=reply, desirable=k % 2 == 0)
        for k, (p, reply) in enumerate(
            zip(PROMPTS * 2, [g for g, _ in REPLIES] + [b for _, b in REPLIES], strict=True)
        )
    ]


def spec(tmp_path: Path, objective: Literal["dpo", "kto"], **changes: Any) -> PreferenceSpec:
    return PreferenceSpec(
        objective=objective,
        model=TINY,
        home=tmp_path / "home",
        pairs=pairs(),
        examples=examples(),
        output_dir=tmp_path / "adapter",
        batch_size=8,
        threads=1,
        **changes,
    )


def perturb(model: PeftModel, seed: int) -> None:
    """Seeded random weights for the trained (``default``) adapter, so the policy moves
    away from the reference."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name and ".default." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def trainer_on(
    tmp_path: Path, trainer: type[Any], dataset: Dataset, args: Any, continued: bool
) -> tuple[LoadedModel, Any]:
    """TRL's trainer on tiny-random with Reef's default LoRA. Fresh: TRL wraps the base
    (its reference: the adapter disabled, as Reef's). Continued: TRL is given an adapter
    already trained (its reference: a frozen copy of it, as Reef's is the base adapter
    as loaded)."""
    loaded = load_model(TINY, tmp_path / "home")
    settings = LoraSettings()
    if continued:
        model = wrap_lora(loaded.model, None, settings)
        perturb(model, 11)
        made = trainer(
            model=model, args=args, train_dataset=dataset, processing_class=loaded.tokenizer
        )
        assert "ref" in made.model.peft_config
        return loaded, made
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    made = trainer(
        model=loaded.model,
        args=args,
        train_dataset=dataset,
        processing_class=loaded.tokenizer,
        peft_config=config,
    )
    return loaded, made


def lora_grads(model: PeftModel) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_same_grads(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    assert ours.keys() == theirs.keys() and ours, "both must train the same LoRA tensors"
    for name, grad in theirs.items():
        assert float(grad.norm()) > 0, f"{name}: TRL's gradient is zero, nothing is compared"
        rel = float((ours[name] - grad).norm() / grad.norm())
        assert rel < GRAD_TOL, f"{name}: gradients differ by {rel:.2e} relative"


def reef_step(model: PeftModel, data: Prepared, s: PreferenceSpec, n: int) -> tuple[float, Any]:
    model.train()
    out = batch_objective(model, data, list(range(n)), s, 0, CPU)
    out.loss.backward()
    return float(out.loss), out


def trl_inputs(features: list[Any]) -> dict[str, torch.Tensor]:
    """TRL's collated batch from Reef's token ids: completion = Reef's labelled tokens."""
    batch = collate(features, 0, CPU)
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "completion_mask": (batch["labels"] != IGNORE_INDEX).long(),
    }


def trl_args(config: type[Any], tmp_path: Path, **changes: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config(
            output_dir=str(tmp_path / "trl"),
            gradient_checkpointing=False,
            bf16=False,
            use_cpu=True,
            report_to="none",
            per_device_train_batch_size=8,
            precompute_ref_log_probs=False,
            **changes,
        )


@pytest.mark.parametrize(
    ("loss_type", "beta", "continued"),
    [("sigmoid", 0.1, False), ("hinge", 0.5, False), ("ipo", 0.3, False), ("sigmoid", 0.1, True)],
)
def test_dpo_matches_trl(
    tmp_path: Path, loss_type: DpoLossType, beta: float, continued: bool
) -> None:
    dataset = Dataset.from_list(
        [
            {"prompt": p.messages, "chosen": assistant(p.chosen), "rejected": assistant(p.rejected)}
            for p in pairs()
        ]
    )
    args = trl_args(DPOConfig, tmp_path, beta=beta, loss_type=[loss_type])
    loaded, trainer = trainer_on(tmp_path, DPOTrainer, dataset, args, continued)
    model = trainer.model
    start = {"base_adapter": tmp_path / "start"} if continued else {}
    s = spec(tmp_path, "dpo", beta=beta, loss_type=loss_type, **start)
    if not continued:
        perturb(model, 7)
    data = prepare(model, loaded.tokenizer, s, 0, CPU)  # the reference, before the policy moves
    if continued:
        perturb(model, 7)
    assert data.features[0].input_ids[:40] == data.features[2].input_ids[:40]  # shared prefix
    ours, out = reef_step(model, data, s, len(PROMPTS))
    ours_grads = lora_grads(model)

    # TRL's batch is every chosen reply, then every rejected one.
    inputs = trl_inputs(data.features[0::2] + data.features[1::2])
    theirs = trainer.compute_loss(model, inputs)
    theirs.backward()
    assert abs(ours - float(theirs)) < LOSS_TOL, (ours, float(theirs))
    assert_same_grads(ours_grads, lora_grads(model))
    # The policy is away from the reference, so the comparison is not at a trivial point.
    assert abs(out.margin) > 0.01
    if loss_type == "hinge":  # some pairs inside the margin, so the relu passes gradient
        assert ours > 0.0


@pytest.mark.parametrize(
    ("weights", "beta", "seed", "clamped"),
    [((1.0, 1.0), 0.1, 1, False), ((1.33, 0.75), 0.5, 1, False), ((1.0, 1.0), 0.1, 2, True)],
)
def test_kto_matches_trl(
    tmp_path: Path, weights: tuple[float, float], beta: float, seed: int, clamped: bool
) -> None:
    """``seed`` 1 moves the policy so the KL estimate is positive; 2 so it is negative
    and clamped to 0: both branches agree with TRL."""
    desirable, undesirable = weights
    dataset = Dataset.from_list(
        [
            {"prompt": e.messages, "completion": assistant(e.target), "label": e.desirable}
            for e in examples()
        ]
    )
    args = trl_args(
        KTOConfig, tmp_path, beta=beta, desirable_weight=desirable, undesirable_weight=undesirable
    )
    loaded, trainer = trainer_on(tmp_path, KTOTrainer, dataset, args, continued=False)
    model = trainer.model
    perturb(model, seed)
    s = spec(tmp_path, "kto", beta=beta, desirable_weight=desirable, undesirable_weight=undesirable)
    data = prepare(model, loaded.tokenizer, s, 0, CPU)
    n = len(data.features)
    assert all(f is not None for f in data.mismatched)
    ours, out = reef_step(model, data, s, n)
    ours_grads = lora_grads(model)

    # TRL's mismatched sequences rotate the batch's replies by one, as Reef's do.
    kl = trl_inputs([f for f in data.mismatched if f is not None])
    inputs = {
        **trl_inputs(data.features),
        "label": torch.tensor(data.desirable),
        **{f"KL_{k}": v for k, v in kl.items()},
    }
    theirs = trainer.compute_loss(model, inputs)
    theirs.backward()
    assert abs(ours - float(theirs)) < LOSS_TOL, (ours, float(theirs))
    assert_same_grads(ours_grads, lora_grads(model))
    # The reference point is TRL's own, live or clamped as the case intends.
    assert (out.kl == 0.0) if clamped else (out.kl > 0.01), out.kl
    assert out.kl == pytest.approx(trainer._metrics["train"]["kl"][-1], abs=LOSS_TOL)

"""Training runs the prompt prefix a batch's rows share once (``decoder_states``): the
loss, its gradients and the token log-probs are those of running every row whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from reef.engine.models import load_model
from reef.learning.trainers.lora_sft import (
    IGNORE_INDEX,
    MIN_SHARED_PREFIX,
    Features,
    build_features,
    collate,
    decoder_states,
    full_model,
    labelled_loss,
    shared_prefix,
    token_logps,
    wrap_lora,
)
from reef.learning.trainers.spec import LoraSettings, SFTExample, SFTSpec

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)

SYSTEM = "Sort each support ticket into billing, shipping or technical. " * 3
TICKETS = [
    ("My card was charged twice", "billing"),
    ("Parcel lost", "shipping"),
    ("App crashes on start", "technical"),
    ("Refund?", "billing"),
]


def _batch(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    loaded = load_model("tiny-random", tmp_path)
    examples = [
        SFTExample(
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
            target=label,
        )
        for text, label in TICKETS
    ]
    features = [build_features(loaded.tokenizer, example, 512) for example in examples]
    return loaded, collate(features, 0, torch.device("cpu"))


def _loss_and_grads(model: Any, batch: dict[str, Any]) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad()
    loss = labelled_loss(model, batch)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad and p.grad is not None]
    return float(loss.detach()), grads


def _same(
    shared: tuple[float, list[torch.Tensor]], whole: tuple[float, list[torch.Tensor]]
) -> None:
    assert shared[0] == pytest.approx(whole[0], rel=1e-5)
    assert len(shared[1]) == len(whole[1]) > 0
    scale = max(float(g.abs().max()) for g in whole[1])
    assert scale > 0
    for mine, theirs in zip(shared[1], whole[1], strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5 * scale, rtol=1e-4)


def test_a_lora_step_on_a_shared_prefix_equals_the_whole_rows(tmp_path: Path) -> None:
    torch.manual_seed(0)
    loaded, batch = _batch(tmp_path)
    assert batch["shared"] >= MIN_SHARED_PREFIX, "the system prompt is shared"
    model = wrap_lora(loaded.model, None, LoraSettings(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # B starts at zero: give the adapter an effect to differentiate
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.1)
    hidden, start = decoder_states(model, batch)
    assert start == batch["shared"] and hidden.shape[1] == batch["input_ids"].shape[1] - start
    _same(_loss_and_grads(model, batch), _loss_and_grads(model, {**batch, "shared": 0}))
    with torch.no_grad():
        shared_logps, shared_rows = token_logps(model, batch)
        whole_logps, whole_rows = token_logps(model, {**batch, "shared": 0})
    assert torch.equal(shared_rows, whole_rows)
    assert torch.allclose(shared_logps, whole_logps, atol=1e-5)


def test_a_full_fine_tune_step_on_a_shared_prefix_equals_the_whole_rows(tmp_path: Path) -> None:
    loaded, batch = _batch(tmp_path)
    spec = SFTSpec(
        model="tiny-random",
        examples=[SFTExample(messages=[{"role": "user", "content": "x"}], target="y")],
        output_dir=tmp_path / "out",
        home=tmp_path,
        mode="full",
    )
    model = full_model(loaded.model, spec, torch.device("cpu"))
    model.train()
    _same(_loss_and_grads(model, batch), _loss_and_grads(model, {**batch, "shared": 0}))


def test_dropout_runs_every_row_whole(tmp_path: Path) -> None:
    loaded, batch = _batch(tmp_path)
    settings = LoraSettings(r=4, dropout=0.1, target_modules=["q_proj", "v_proj"])
    model = wrap_lora(loaded.model, None, settings)
    model.train()
    assert decoder_states(model, batch)[1] == 0, "each row draws its own dropout mask"
    model.eval()
    assert decoder_states(model, batch)[1] == batch["shared"]


def _features(ids: list[int], prompt: int) -> Features:
    return Features(ids, [IGNORE_INDEX] * prompt + ids[prompt:], 1.0)


def test_what_counts_as_shared() -> None:
    common = list(range(100, 100 + 50))
    a = _features([*common, 1, 2, 3], 51)
    b = _features([*common, 4, 5], 50)
    # the last position before a row's first label is where its hidden states start
    assert shared_prefix([a, b]) == 49
    assert shared_prefix([a]) == 0, "one row: nothing to share"
    short = _features([*common[:20], 7, 8], 21)
    assert shared_prefix([a, short]) == 0, f"under {MIN_SHARED_PREFIX} tokens"
    labelled_early = _features([*common, 9], 40)
    assert shared_prefix([a, labelled_early]) == 39
    same = _features([*common, 1, 2, 3], 51)
    assert shared_prefix([a, same]) == 50

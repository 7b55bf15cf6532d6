"""bf16 training (``reef.learning.trainers.precision``): ``auto`` is bf16 on CUDA only
(float32 on every CPU, measured), a CPU's AMX is read from its flags, a bf16 LoRA run
keeps its trainable weights and the saved adapter in float32 while the frozen base is
stored in bfloat16, and it learns what the same run learns in float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from reef.engine.models import TINY_MODEL, load_model
from reef.engine.process import cpu_has_amx
from reef.learning.trainers import Budget, SFTExample, SFTSpec
from reef.learning.trainers.lora_sft import train_lora_sft, wrap_lora
from reef.learning.trainers.precision import autocast, prepare_bf16, use_bf16
from reef.learning.trainers.spec import LoraSettings
from tests.engine.lora_factory import PEFT_WRAP_WARNING

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)


def test_auto_is_float32_on_a_cpu_and_amx_is_read_from_the_flags(tmp_path: Path) -> None:
    amx = tmp_path / "amx"
    amx.write_text("processor: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n")
    avx512 = tmp_path / "avx512"
    avx512.write_text("processor: 0\nflags\t\t: fpu avx512f avx512_bf16\n")
    assert cpu_has_amx(amx) and not cpu_has_amx(avx512)
    assert not cpu_has_amx(tmp_path / "missing")
    cpu = torch.device("cpu")
    assert use_bf16("auto", cpu) is False  # whatever the CPU: see the module docstring
    assert use_bf16(True, cpu) is True and use_bf16(False, cpu) is False


def test_prepare_stores_the_frozen_base_in_bfloat16_and_keeps_lora_in_float32(
    tmp_path: Path,
) -> None:
    loaded = load_model(TINY_MODEL, tmp_path)
    model = wrap_lora(loaded.model, None, LoraSettings(r=4, alpha=8))
    cpu = torch.device("cpu")
    assert prepare_bf16(model, cpu, False) is model
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    prepare_bf16(model, cpu, True)
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    trained = {p.dtype for p in model.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}
    assert model.get_base_model().config._attn_implementation == "eager"
    ids = torch.tensor([[1, 2, 3, 4]])
    with autocast(cpu, True):
        logits = model(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    with autocast(cpu, False):
        assert not torch.is_autocast_enabled("cpu")


def _spec(tmp_path: Path, bf16: bool) -> SFTSpec:
    examples = [
        SFTExample(messages=[{"role": "user", "content": f"code for item {i}?"}], target="Squid-7")
        for i in range(8)
    ]
    return SFTSpec(
        model=TINY_MODEL,
        home=tmp_path,
        examples=examples,
        output_dir=tmp_path / ("bf16" if bf16 else "fp32"),
        lora=LoraSettings(r=8, alpha=16),
        lr=2e-2,
        budget=Budget(steps=16, validation_fraction=0.0),
        batch_size=4,
        threads=1,
        device="cpu",
        bf16=bf16,
    )


def test_a_bf16_lora_run_learns_as_the_float32_run_does_and_saves_float32(
    tmp_path: Path,
) -> None:
    fp32 = train_lora_sft(_spec(tmp_path, False)).metrics
    bf16 = train_lora_sft(_spec(tmp_path, True)).metrics
    assert fp32["bf16"] is False and bf16["bf16"] is True
    for curve in (fp32["loss_curve"], bf16["loss_curve"]):
        assert curve[-1] < curve[0] - 0.3  # both learn (measured: 5.59 -> 4.97)
    # the same run, rounded differently: the curves stay together step by step
    gaps = [abs(a - b) for a, b in zip(fp32["loss_curve"], bf16["loss_curve"], strict=True)]
    assert max(gaps) < 0.1  # measured: 0.01
    with safe_open(str(tmp_path / "bf16" / "adapter_model.safetensors"), "pt") as weights:  # type: ignore[no-untyped-call]
        dtypes = {weights.get_tensor(name).dtype for name in weights.keys()}  # noqa: SIM118
    assert dtypes == {torch.float32}


def test_bf16_episodes_sample_from_a_bfloat16_engine_close_to_the_trainer(
    tmp_path: Path,
) -> None:
    from reef.learning.trainers.grpo import train_grpo
    from tests.learning.test_rl_episodes import spec_for

    metrics = train_grpo(spec_for(tmp_path, 2, bf16=True, group_size=4, batch_size=2)).metrics
    assert metrics["bf16"] is True and metrics["sampler"] == "local-engine"
    assert metrics["samples"] == 2 * 2 * 4 and metrics["episodes_failed"] == 0
    # bf16 rounding on both sides, different kernels: close, not equal (float32: 0.0)
    gap = metrics["engine_logprob_gap"]
    assert gap is not None and gap < 0.01, gap  # measured: 7.5e-4

"""The engine's precisions (``reef.engine.precision``). Packed bfloat16 layers compute
what torch's bfloat16 layers compute; weight-only int8 and float16 layers compute with
the rounded weights and nothing else; PEFT adapters on either apply as on any linear layer (an
engine in each precision serving the base, an adapter and a checkpoint:
tests/engine/test_dtypes.py)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import DynamicCache

from reef.engine.adapters import BASE_ADAPTER, AdapterModel
from reef.engine.errors import ModelSourceError
from reef.engine.models import load_model
from reef.engine.precision import (
    FP16_MAX,
    INT8_STEPS,
    Fp16Linear,
    Int8Linear,
    PackedLinear,
    apply_precision,
    can_fp16,
    can_pack,
    precision_of,
    quantize_int8,
)
from reef.engine.process import EngineOptions, cpu_has_bf16, engine_command, resolve_dtype
from reef.engine.server import load_for_serving
from tests.engine.lora_factory import PEFT_WRAP_WARNING

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)


def test_an_int8_layer_computes_with_its_rounded_weight() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=False)
    quantized = Int8Linear(linear.to(torch.bfloat16))
    assert quantized.weight.dtype == torch.int8
    assert int(quantized.weight.abs().max()) <= INT8_STEPS
    assert bool((quantized.weight.abs().amax(dim=1) >= INT8_STEPS - 1).all()), "rows use the range"
    rounding = (quantized.dequantized() - linear.weight.float()).abs()
    step = quantized.scales.float()[:, None]
    assert bool((rounding <= step * 0.5 + 1e-7).all()), "each weight is within half a step"
    x = torch.randn(3, 5, 64).to(torch.bfloat16)
    expected = x.float() @ quantized.dequantized().T
    got = quantized(x)
    assert got.shape == (3, 5, 48) and got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), expected, atol=0.05, rtol=0.02)


def test_quantizing_replaces_the_layers_projections_and_keeps_the_head(tmp_path: Path) -> None:
    loaded = load_model("tiny-random", tmp_path, dtype=torch.bfloat16)
    layers = len(loaded.model.model.layers)
    assert precision_of(loaded.model) == "bfloat16"
    assert quantize_int8(loaded.model) == 7 * layers  # q, k, v, o, gate, up, down
    assert type(loaded.model.lm_head) is nn.Linear
    assert precision_of(loaded.model) == "int8"
    assert resolve_dtype("int8") == "int8"
    command = engine_command("tiny-random", tmp_path, options=EngineOptions(dtype="int8"))
    assert command[command.index("--dtype") + 1] == "int8"


needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="packed bfloat16 layers need torch with oneDNN on a CPU with AVX-512 (BW, VL, "
    "DQ) or AVX-NE-CONVERT; this one has neither",
)


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="this CPU runs oneDNN's bfloat16 kernels: nothing falls back",
)
def test_a_cpu_without_onednn_bfloat16_keeps_torchs_layers(tmp_path: Path) -> None:
    loaded = load_model("tiny-random", tmp_path, dtype=torch.bfloat16)
    assert not can_pack(loaded.model)
    apply_precision(loaded.model, "bfloat16")
    assert not any(isinstance(m, PackedLinear) for m in loaded.model.modules())
    assert precision_of(loaded.model) == "bfloat16"
    prompt = torch.tensor([[5, 9, 13, 21, 34, 2]])
    assert torch.isfinite(_logits(AdapterModel(loaded.model), prompt, BASE_ADAPTER)).all()


@needs_onednn
def test_a_packed_layer_computes_what_the_bfloat16_layer_does() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    packed = PackedLinear(linear)
    for rows in (1, 8, 37):
        x = torch.randn(rows, 3, 64).to(torch.bfloat16)
        expected = linear(x).float()
        got = packed(x)
        assert got.shape == (rows, 3, 48) and got.dtype == torch.bfloat16
        assert torch.allclose(got.float(), expected, atol=0.02, rtol=0.01)


@needs_onednn
def test_a_bfloat16_model_is_packed_and_answers_as_before(tmp_path: Path) -> None:
    plain = load_model("tiny-random", tmp_path, dtype=torch.bfloat16)
    packed = load_model("tiny-random", tmp_path, dtype=torch.bfloat16)
    assert can_pack(packed.model)
    apply_precision(packed.model, "bfloat16")
    layers = len(packed.model.model.layers)
    found = [m for m in packed.model.modules() if isinstance(m, PackedLinear)]
    # q/k/v fused into one layer and gate/up into another (reef.engine.decoder), then
    # packed: four per layer, and the output head
    assert len(found) == 4 * layers + 1, "every projection and the output head"
    assert precision_of(packed.model) == "bfloat16"
    prompt = torch.tensor([[5, 9, 13, 21, 34, 2]])
    ours = _logits(AdapterModel(packed.model), prompt, BASE_ADAPTER)
    theirs = _logits(AdapterModel(plain.model), prompt, BASE_ADAPTER)
    assert torch.allclose(ours, theirs, atol=0.02)
    float32 = load_model("tiny-random", tmp_path)
    apply_precision(float32.model, "float32")
    assert not any(isinstance(m, PackedLinear) for m in float32.model.modules()), (
        "float32 stays torch's own layers: the reference"
    )


def _adapter_on_projections(directory: Path) -> Path:
    """A LoRA on every attention and MLP projection of tiny-random, with a large random
    delta (B is zero after PEFT's initialisation; here it is not)."""
    base = load_model("tiny-random", directory.parent / "adapter-home").model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=modules))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    peft.save_pretrained(str(directory), safe_serialization=True)
    return directory


def _logits(model: AdapterModel, prompt: torch.Tensor, adapter: str) -> torch.Tensor:
    mask = torch.ones_like(prompt)
    positions = torch.arange(prompt.shape[1])[None, :]
    cache = DynamicCache(config=model.base.config)
    with torch.inference_mode():
        return model.forward_logits(prompt, mask, positions, cache, [adapter])


def _adapter_effect(ours: nn.Module, theirs: nn.Module, adapter: Path) -> tuple[float, float]:
    """(how far ``adapter`` moves ``ours``'s logits, how far ``ours`` with it lands from
    ``theirs`` with it), on one prompt."""
    prompt = torch.tensor([[5, 9, 13, 21, 34, 2]])
    mine, reference = AdapterModel(ours), AdapterModel(theirs)
    for runner in (mine, reference):
        runner.load("reef-1", adapter)
    tuned, base = _logits(mine, prompt, "reef-1"), _logits(mine, prompt, BASE_ADAPTER)
    expected = _logits(reference, prompt, "reef-1")
    return float((tuned - base).abs().max()), float((tuned - expected).abs().max())


def _hold_rounded(reference: nn.Module, rounded: nn.Module, kind: type[nn.Module]) -> None:
    """Copy into ``reference``'s layers the weights ``rounded``'s ``kind`` layers compute
    with (their ``dequantized()``), in ``reference``'s dtype."""
    weights = {n: m.dequantized() for n, m in rounded.named_modules() if isinstance(m, kind)}
    with torch.no_grad():
        for name, module in reference.named_modules():
            if name in weights:
                module.weight.copy_(weights[name].to(module.weight.dtype))


@needs_onednn
def test_an_adapter_on_packed_projections_adds_its_delta(tmp_path: Path) -> None:
    adapter = _adapter_on_projections(tmp_path / "adapter")
    packed = load_model("tiny-random", tmp_path / "a", dtype=torch.bfloat16)
    apply_precision(packed.model, "bfloat16")
    reference = load_model("tiny-random", tmp_path / "b", dtype=torch.bfloat16)
    change, error = _adapter_effect(packed.model, reference.model, adapter)
    assert change > 0.2, "the adapter changes the logits"
    assert error < change / 10, (error, change)


def test_an_adapter_on_quantized_projections_adds_its_delta(tmp_path: Path) -> None:
    """The int8 model with the adapter answers as a bfloat16 model holding the same
    rounded weights with the same adapter does: PEFT wraps :class:`Int8Linear` as a
    linear layer and adds the adapter's product to the int8 kernel's."""
    adapter = _adapter_on_projections(tmp_path / "adapter")
    int8 = load_model("tiny-random", tmp_path / "a", dtype=torch.bfloat16)
    apply_precision(int8.model, "int8")
    reference = load_model("tiny-random", tmp_path / "b", dtype=torch.bfloat16)
    _hold_rounded(reference.model, int8.model, Int8Linear)
    change, error = _adapter_effect(int8.model, reference.model, adapter)
    assert change > 0.2, "the adapter changes the logits"
    assert error < change / 10, (error, change)


needs_fbgemm = pytest.mark.skipif(
    can_fp16() is not None,
    reason=f"float16 layers need fbgemm: {can_fp16()}",
)


@needs_fbgemm
@pytest.mark.parametrize("bias", [False, True])
def test_a_float16_layer_computes_with_its_rounded_weight_in_float32(bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=bias)
    direct, quantized_op = Fp16Linear(linear), Fp16Linear(linear, direct=False)
    assert not quantized_op.direct
    rounded = linear.weight.detach().half().double()
    for layer in (direct, quantized_op):
        assert torch.equal(layer.dequantized(), rounded.float()), "the weight, rounded once"
        for rows in (1, 8, 37):
            x = torch.randn(rows, 3, 96)
            expected = x.double() @ rounded.T
            if bias:
                expected = expected + linear.bias.detach().double()
            got = layer(x)
            assert got.shape == (rows, 3, 40) and got.dtype == torch.float32
            # float32 activations and sums: far closer than bfloat16's 1e-2
            assert float((got.double() - expected).abs().max()) < 1e-4
    x = torch.randn(5, 96)
    assert torch.allclose(direct(x), quantized_op(x), atol=1e-5), "the same kernel either way"
    stand_in = direct.weight  # for PEFT: shape, dtype, device; values NaN
    assert stand_in.shape == (40, 96) and stand_in.dtype == torch.float32
    assert bool(stand_in.isnan().all())
    assert (direct.bias is None) is not bias


@needs_fbgemm
def test_a_weight_beyond_float16s_range_is_refused() -> None:
    linear = nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        linear.weight[0, 0] = FP16_MAX * 2
    with pytest.raises(ValueError, match="does not fit in float16"):
        Fp16Linear(linear)


@needs_fbgemm
def test_a_float16_model_packs_every_projection_and_answers_as_float32(tmp_path: Path) -> None:
    reference = load_model("tiny-random", tmp_path)
    half = load_model("tiny-random", tmp_path)
    apply_precision(half.model, "float16")
    layers = len(half.model.model.layers)
    found = [m for m in half.model.modules() if isinstance(m, Fp16Linear)]
    assert len(found) == 4 * layers + 1, "fused q/k/v, o, fused gate/up, down; the head"
    assert precision_of(half.model) == "float16"
    assert resolve_dtype("float16") == "float16"
    prompt = torch.tensor([[5, 9, 13, 21, 34, 2]])
    ours = _logits(AdapterModel(half.model), prompt, BASE_ADAPTER)
    theirs = _logits(AdapterModel(reference.model), prompt, BASE_ADAPTER)
    difference = float((ours - theirs).abs().max())
    assert 0 < difference < 0.02, difference
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


@needs_fbgemm
def test_an_adapter_on_float16_projections_adds_its_delta(tmp_path: Path) -> None:
    """PEFT wraps :class:`Fp16Linear` as a linear layer whose compute dtype is float32:
    the adapter stays in float32 and its delta is added to fbgemm's product; the model
    answers as a float32 model holding the rounded weights with the same adapter."""
    adapter = _adapter_on_projections(tmp_path / "adapter")
    half = load_model("tiny-random", tmp_path / "a")
    apply_precision(half.model, "float16")
    reference = load_model("tiny-random", tmp_path / "b")
    apply_precision(reference.model, "float32")
    _hold_rounded(reference.model, half.model, Fp16Linear)
    change, error = _adapter_effect(half.model, reference.model, adapter)
    assert change > 0.2, "the adapter changes the logits"
    assert error < 1e-4, (error, change)
    lora = next(m for n, m in half.model.named_modules() if n.endswith("o_proj.lora_A.reef-1"))
    assert lora.weight.dtype == torch.float32


@needs_fbgemm
def test_auto_serves_float16_and_falls_back_where_a_weight_does_not_fit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    assert precision_of(load_for_serving("tiny-random", home, "auto", cuda=False).model) == (
        "float16"
    )
    big = load_model("tiny-random", home)
    with torch.no_grad():
        big.model.model.layers[0].mlp.down_proj.weight[0, 0] = FP16_MAX * 2
    big.model.save_pretrained(tmp_path / "big")
    big.tokenizer.save_pretrained(tmp_path / "big")
    with caplog.at_level(logging.WARNING, logger="reef.engine.server"):
        served = load_for_serving(str(tmp_path / "big"), home, "auto", cuda=False)
    assert precision_of(served.model) == ("bfloat16" if cpu_has_bf16() else "float32")
    assert "cannot be served in float16" in caplog.text and "does not fit" in caplog.text
    # the large weight is served as it is (packed layers have no readable weight: the
    # layer's product with a one-hot input reads it)
    down = served.model.model.layers[0].mlp.down_proj
    one_hot = torch.zeros(1, down.in_features, dtype=served.model.dtype)
    one_hot[0, 0] = 1
    with torch.inference_mode():
        assert float(down(one_hot)[0, 0]) > FP16_MAX
    with pytest.raises(ModelSourceError, match=r"cannot be served in float16: .*does not fit"):
        load_for_serving(str(tmp_path / "big"), home, "float16", cuda=False)


def test_float16_where_fbgemm_cannot_run_is_refused_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reef.engine.precision as precision

    monkeypatch.setattr(precision, "can_fp16", lambda: "this torch build has no fbgemm")
    loaded = load_model("tiny-random", tmp_path)
    with pytest.raises(ValueError, match="float16 cannot run here: this torch build has no fbgemm"):
        apply_precision(loaded.model, "float16")

"""The engine's lean forward pass (``reef.engine.decoder``) computes what Hugging Face's
model forward computes: on a left-padded batch whose rows join at different times, with
an adapter on some rows, in float32 and bfloat16; models it cannot run keep Hugging
Face's forward."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
)

from reef.engine.adapters import AdapterModel
from reef.engine.batch import DecodeBatch
from reef.engine.decoder import SliceLinear, adapter_groups, fuse_projections, supports
from reef.engine.errors import AdapterRejectedError
from reef.engine.models import LoadedModel, load_model
from reef.engine.sequences import GenerationJob, SamplingParams, Sequence
from tests.engine.conftest import TINY
from tests.engine.lora_factory import PEFT_WRAP_WARNING, make_random_adapter

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)


class _Job(GenerationJob):
    def __init__(self, prompt: list[int], adapter: str) -> None:
        super().__init__(
            tuple(prompt), SamplingParams(max_tokens=64, temperature=0), 1, None, print, print
        )
        self._adapter = adapter

    @property
    def adapter_key(self) -> str:
        return self._adapter


def _run(
    loaded: LoadedModel, runner: AdapterModel, adapter: str
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Three rows of different prompt lengths (so prefill pads), the second on
    ``adapter``, a fourth joining after three steps on ``adapter`` (so caches of
    different widths merge, and the adapter's rows go from one run, a slice, to rows 1
    and 3, an index), ten greedy steps; each step's logits and every row's tokens."""
    batch = DecodeBatch(runner, loaded.model.config)
    first = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    rows = [
        Sequence(_Job(prompt, adapter if index == 1 else "__base__"), 0, frozenset())
        for index, prompt in enumerate(first)
    ]
    tokens: list[list[int]] = [[] for _ in range(4)]
    seen: list[torch.Tensor] = []
    with torch.inference_mode():
        logits = batch.prefill(rows)
        for step in range(10):
            if step == 3:
                late = Sequence(_Job([20, 21, 22, 23, 24], adapter), 0, frozenset())
                logits = torch.cat([logits, batch.prefill([late])])
            seen.append(logits)
            chosen = logits.argmax(-1)
            for row, token in enumerate(chosen.tolist()):
                tokens[row].append(token)
            batch.set_next_tokens(0, chosen)
            logits = batch.step()
    return tokens, seen


def _both(
    loaded: LoadedModel, adapter_dir: Path | None
) -> tuple[tuple[list[list[int]], list[torch.Tensor]], tuple[list[list[int]], list[torch.Tensor]]]:
    runner = AdapterModel(loaded.model)
    assert runner.lean is not None
    adapter = "__base__"
    if adapter_dir is not None:
        runner.load("reef-1", adapter_dir)
        adapter = "reef-1"
    lean = _run(loaded, runner, adapter)
    runner.lean = None  # Hugging Face's forward
    return lean, _run(loaded, runner, adapter)


@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused"])
@pytest.mark.parametrize(
    "with_adapter",
    [None, ("q_proj", "v_proj", "down_proj"), ("q_proj", "v_proj")],
    ids=["base", "adapter", "adapter-on-fused-only"],
)
def test_float32_logits_are_hugging_faces(
    tmp_path: Path, with_adapter: tuple[str, ...] | None, fused: bool
) -> None:
    """With an adapter on fused projections only, the lean pass routes rows itself and
    skips PEFT's per-call hooks; with one on down_proj too, PEFT's hooks route that."""
    loaded = load_model(TINY, tmp_path)
    if fused:
        assert fuse_projections(loaded.model) == 2 * loaded.model.config.num_hidden_layers
    adapter = (
        make_random_adapter(tmp_path / "adapter", seed=5, targets=with_adapter)
        if with_adapter
        else None
    )
    (lean_tokens, lean_logits), (hf_tokens, hf_logits) = _both(loaded, adapter)
    assert lean_tokens == hf_tokens
    for ours, theirs in zip(lean_logits, hf_logits, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    if with_adapter:
        # the late row ran under the adapter: without it, it decodes something else
        alone = AdapterModel(load_model(TINY, tmp_path).model)
        assert _run(loaded, alone, "__base__")[0][3] != lean_tokens[3]


def test_bfloat16_logits_stay_near_float32s(tmp_path: Path) -> None:
    reference = load_model(TINY, tmp_path)
    loaded = load_model(TINY, tmp_path, dtype=torch.bfloat16)
    fuse_projections(loaded.model)
    (_, lean_logits), (_, hf_logits) = _both(loaded, None)
    float32_runner = AdapterModel(reference.model)
    float32_runner.lean = None
    _, exact = _run(reference, float32_runner, "__base__")
    lean_error = max(float((a - b).abs().max()) for a, b in zip(lean_logits, exact, strict=True))
    hf_error = max(float((a - b).abs().max()) for a, b in zip(hf_logits, exact, strict=True))
    # float32 attention over a float32 cache: no further from float32 than Hugging
    # Face's bfloat16 forward (measured: 0.0039 against 0.0045, on logits up to 0.63)
    assert lean_error <= hf_error * 1.25
    assert lean_error < 0.02


def test_llama_family_models_take_the_lean_pass_and_others_do_not() -> None:
    small = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 64}
    llama = LlamaForCausalLM(LlamaConfig(intermediate_size=64, num_key_value_heads=2, **small))
    assert supports(llama)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_head=4, n_layer=1, vocab_size=64))
    assert not supports(gpt2)
    runner = AdapterModel(gpt2)
    assert runner.lean is None


def test_fused_projections_compute_the_separate_ones(tmp_path: Path) -> None:
    separate = load_model(TINY, tmp_path).model
    fused = load_model(TINY, tmp_path).model
    fuse_projections(fused)
    attention, mlp = fused.model.layers[0].self_attn, fused.model.layers[0].mlp
    assert isinstance(attention.k_proj, SliceLinear) and isinstance(mlp.up_proj, SliceLinear)
    # the originals are gone: one weight per fused layer, no copy left behind
    names = {name for name, _ in fused.named_parameters()}
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert not any(name.endswith(("q_proj.weight", "gate_proj.weight")) for name in names)
    x = torch.randn(2, 3, fused.config.hidden_size)
    theirs = separate.model.layers[0]
    for ours, reference in (
        (attention.q_proj, theirs.self_attn.q_proj),
        (attention.k_proj, theirs.self_attn.k_proj),
        (attention.v_proj, theirs.self_attn.v_proj),
        (mlp.gate_proj, theirs.mlp.gate_proj),
        (mlp.up_proj, theirs.mlp.up_proj),
    ):
        torch.testing.assert_close(ours(x), reference(x), rtol=1e-6, atol=1e-6)


def test_a_dora_adapter_is_refused_with_the_reason(tmp_path: Path) -> None:
    """PEFT cannot route a batch's rows to DoRA adapters: the engine refuses one at load,
    saying so, rather than failing every request that names it."""
    base = load_model(TINY, tmp_path / "dora-home").model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True)
        get_peft_model(base, config).save_pretrained(tmp_path / "dora")
    loaded = load_model(TINY, tmp_path)
    fuse_projections(loaded.model)
    runner = AdapterModel(loaded.model)
    with pytest.raises(AdapterRejectedError, match="uses Dora, not plain LoRA"):
        runner.load("reef-1", tmp_path / "dora")
    assert runner.loaded == set()
    # the model still serves, and a plain adapter still loads
    runner.load("reef-2", make_random_adapter(tmp_path / "plain", seed=5))
    assert _run(loaded, runner, "reef-2")[0][3]


@pytest.mark.parametrize(
    "config",
    [
        MistralConfig(sliding_window=None),
        # Qwen2's q/k/v projections carry biases: the fused layer concatenates them
        Qwen2Config(use_sliding_window=False),
    ],
    ids=["mistral", "qwen2"],
)
def test_other_llama_family_models_match_hugging_face(config: PretrainedConfig) -> None:
    config.update(
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
            "vocab_size": 96,
            "max_position_embeddings": 256,
        }
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):  # initialised to zero: make them count
                parameter.normal_(0.0, 0.5)
    reference = AutoModelForCausalLM.from_config(config).eval()  # the same weights, unfused
    reference.load_state_dict(model.state_dict())
    assert supports(model)
    assert fuse_projections(model) == 4
    loaded = LoadedModel(model, None, "tiny", frozenset())  # type: ignore[arg-type]
    lean_tokens, lean_logits = _run(loaded, AdapterModel(model), "__base__")
    plain = AdapterModel(reference)
    plain.lean = None
    hf_tokens, hf_logits = _run(loaded, plain, "__base__")
    assert lean_tokens == hf_tokens
    for ours, theirs in zip(lean_logits, hf_logits, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_an_adapters_rows_are_a_slice_when_contiguous() -> None:
    groups = adapter_groups(["b", "a", "a", "__base__", "b", "a"], "__base__")
    assert set(groups) == {"a", "b"}
    assert torch.equal(groups["b"], torch.tensor([0, 4]))  # type: ignore[arg-type]
    assert torch.equal(groups["a"], torch.tensor([1, 2, 5]))  # type: ignore[arg-type]
    groups = adapter_groups(["__base__", "a", "a", "b"], "__base__")
    assert groups == {"a": slice(1, 3), "b": slice(3, 4)}
    assert adapter_groups(["__base__"] * 3, "__base__") == {}

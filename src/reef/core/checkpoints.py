"""Checkpoint directories: what a full model checkpoint artifact may hold, checked
without torch, shared by the engine (before it loads one) and the learners (before they
store one).

A checkpoint is a Hugging Face model directory: ``config.json``, the weights as
safetensors (one ``model.safetensors``, or shards listed by
``model.safetensors.index.json``), optionally ``generation_config.json`` and tokenizer
files. Nothing that may hold a pickle (``.bin``, ``.pt``, …) is accepted. Every shard's
header is read and its size checked against the tensors it declares, so a truncated
shard is refused before any load; its digest (``reef.core.digests.tree_digest``) is
checked by the caller.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef.core.digests import tree_digest, tree_files
from reef.core.errors import InvalidInputError

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib"})
"""File suffixes that may hold pickled Python objects; a checkpoint holding one is refused."""

SHARD_INDEX = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit

DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


class CheckpointError(InvalidInputError):
    """A checkpoint directory was refused: pickle files, no config or weights, a
    truncated or malformed shard, or a digest that is not the one expected."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A checked checkpoint: its tree digest, shard files, the tensors' element count
    and the bytes they occupy on disk (their stored dtypes)."""

    digest: str
    shards: tuple[str, ...]
    parameters: int
    weight_bytes: int

    def bytes_as(self, element_bytes: int) -> int:
        """What the weights occupy in memory at ``element_bytes`` per element."""
        return self.parameters * element_bytes


def read_shard_header(path: Path) -> tuple[int, int]:
    """(element count, data bytes) of the safetensors file at ``path``, from its header;
    raises ``CheckpointError`` when the header is malformed or the file is shorter or
    longer than the tensors it declares (truncated, or trailing bytes)."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise CheckpointError(f"shard {path.name!r} is truncated: no header")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise CheckpointError(f"shard {path.name!r} is truncated or not safetensors")
        try:
            header: dict[str, Any] = json.loads(handle.read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"shard {path.name!r} has a malformed header: {exc}") from exc
    elements = end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = (int(x) for x in entry["data_offsets"])
            count = 1
            for dim in entry["shape"]:
                count *= int(dim)
            width = DTYPE_BYTES[entry["dtype"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"shard {path.name!r}: bad entry for {name!r}") from exc
        if stop - start != count * width or start < 0:
            raise CheckpointError(f"shard {path.name!r}: {name!r} has inconsistent offsets")
        elements += count
        end = max(end, stop)
    if 8 + length + end != size:
        raise CheckpointError(
            f"shard {path.name!r} is truncated or padded: {size} bytes, its header "
            f"declares {8 + length + end}"
        )
    return elements, end


def _shard_names(path: Path, names: set[str]) -> list[str]:
    if SHARD_INDEX in names:
        try:
            index = json.loads((path / SHARD_INDEX).read_text(encoding="utf-8"))
            listed = sorted(set(index["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {SHARD_INDEX} is malformed: {exc}") from exc
        missing = [name for name in listed if name not in names]
        if missing:
            raise CheckpointError(f"checkpoint is missing shards {missing}")
        return listed
    if "model.safetensors" in names:
        return ["model.safetensors"]
    raise CheckpointError("checkpoint has no model.safetensors (nor a shard index)")


def check_checkpoint_directory(path: Path, expected_digest: str | None = None) -> CheckpointInfo:
    """Refuse anything but a safetensors checkpoint (module docstring); return what it
    holds. When ``expected_digest`` is given the directory's tree digest must equal it.
    Raises ``CheckpointError``."""
    try:
        files = tree_files(path)
    except InvalidInputError as exc:
        raise CheckpointError(f"checkpoint {exc.message}") from exc
    pickles = [rel for rel, _ in files if Path(rel).suffix.lower() in PICKLE_SUFFIXES]
    if pickles:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds pickle files {pickles}; only safetensors are loaded"
        )
    names = {rel for rel, _ in files}
    if "config.json" not in names:
        raise CheckpointError(f"checkpoint {str(path)!r} has no config.json")
    shards = _shard_names(path, names)
    parameters = weight_bytes = 0
    for shard in shards:
        count, data = read_shard_header(path / shard)
        parameters += count
        weight_bytes += data
    digest = tree_digest(path)
    if expected_digest is not None and expected_digest != digest:
        raise CheckpointError(
            f"checkpoint digest mismatch: expected {expected_digest}, found {digest}"
        )
    return CheckpointInfo(digest, tuple(shards), parameters, weight_bytes)

"""Checkpoint artifacts: a checkpoint directory is stored and materialized streaming and
by digest; the checks refuse a digest mismatch, pickle files and a truncated shard, and
a stored checkpoint whose bytes changed is never materialized."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from reef.core.checkpoints import CheckpointError, check_checkpoint_directory
from reef.core.digests import tree_digest
from reef.releases import ArtifactCorruptError, open_artifact_store


def _shard(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file with zero-filled tensors ``{name: (dtype, shape)}``."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = {"F32": 4, "BF16": 2}[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def checkpoint(root: Path, sharded: bool = False) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "llama"}')
    if sharded:
        _shard(root / "model-00001-of-00002.safetensors", {"a": ("F32", [4, 4])})
        _shard(root / "model-00002-of-00002.safetensors", {"b": ("BF16", [8])})
        weight_map = {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
        (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    else:
        _shard(root / "model.safetensors", {"a": ("F32", [4, 4]), "b": ("BF16", [8])})
    return root


@pytest.mark.parametrize("sharded", [False, True])
def test_a_checkpoint_is_checked_and_counted(tmp_path: Path, sharded: bool) -> None:
    path = checkpoint(tmp_path / "ck", sharded)
    info = check_checkpoint_directory(path, tree_digest(path))
    assert info.parameters == 24 and info.weight_bytes == 64 + 16
    assert info.bytes_as(4) == 96
    assert len(info.shards) == (2 if sharded else 1)


def test_a_digest_mismatch_is_refused(tmp_path: Path) -> None:
    path = checkpoint(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="digest mismatch"):
        check_checkpoint_directory(path, "sha256:" + "0" * 64)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "optimizer.pt", "extra/state.pkl"])
def test_pickle_files_are_refused(tmp_path: Path, name: str) -> None:
    path = checkpoint(tmp_path / "ck")
    (path / name).parent.mkdir(exist_ok=True)
    (path / name).write_bytes(b"\x80\x04K*.")
    with pytest.raises(CheckpointError, match="pickle"):
        check_checkpoint_directory(path)


@pytest.mark.parametrize("cut", [1, 40, 1000])
def test_a_truncated_shard_is_refused(tmp_path: Path, cut: int) -> None:
    path = checkpoint(tmp_path / "ck")
    shard = path / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-cut])
    with pytest.raises(CheckpointError, match="truncated"):
        check_checkpoint_directory(path)


def test_missing_files_are_refused(tmp_path: Path) -> None:
    path = checkpoint(tmp_path / "ck", sharded=True)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing shards"):
        check_checkpoint_directory(path)
    (path / "model.safetensors.index.json").unlink()
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        check_checkpoint_directory(path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        check_checkpoint_directory(path)


def test_the_store_verifies_a_checkpoint_on_materialize(tmp_path: Path) -> None:
    store = open_artifact_store(tmp_path / "store")
    path = checkpoint(tmp_path / "ck", sharded=True)
    digest = store.put_dir(path, "checkpoint", {"learner": "full"})
    assert digest == tree_digest(path)
    copy = store.materialize(digest, tmp_path / "copy")
    assert check_checkpoint_directory(copy, digest).parameters == 24

    # the stored archive changes (one tensor's dtype) or is cut short: never materialized
    archive = Path(store.object_path(digest, "dir"))  # type: ignore[attr-defined]
    stored = archive.read_bytes()
    assert stored.count(b'"F32"') == 1
    cut = stored.index(b'"BF16"') + 2  # inside the second shard: a truncated upload
    for damaged in (stored.replace(b'"F32"', b'"I32"'), stored[:cut]):
        archive.write_bytes(damaged)
        shutil.rmtree(store.cache_dir, ignore_errors=True)  # type: ignore[attr-defined]
        with pytest.raises(ArtifactCorruptError):
            store.materialize(digest, tmp_path / "again")
        assert not (tmp_path / "again").exists()

"""The artifact store on a local directory, a file:// URL elsewhere and memory://."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.core.digests import tree_digest
from reef.core.errors import InvalidInputError
from reef.releases import (
    ArtifactCorruptError,
    ArtifactNotFoundError,
    FsspecArtifactStore,
    InvalidDigestError,
    collect_garbage,
    open_artifact_store,
)


@pytest.fixture(params=["local", "file-url", "memory"])
def artifact_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FsspecArtifactStore]:
    cache = tmp_path / "cache"
    if request.param == "local":
        url: str = str(tmp_path / "home" / "artifacts")
    elif request.param == "file-url":
        url = (tmp_path / "elsewhere" / "store").as_uri()
    else:
        url = f"memory://reef-test-{uuid.uuid4().hex}"
    store = open_artifact_store(url, cache_dir=cache)
    assert isinstance(store, FsspecArtifactStore)
    yield store
    if request.param == "memory":
        store.fs.rm(store.root, recursive=True)


@pytest.fixture
def adapter_dir(tmp_path: Path) -> Path:
    root = tmp_path / "adapter"
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "adapter_config.json").write_text('{"r": 8}')
    (root / "adapter_model.safetensors").write_bytes(b"hello adapter" + bytes(range(256)) * 40)
    (root / "nested" / "deeper" / "notes é.txt").write_text("unicode name")
    (root / "nested" / "empty.txt").write_bytes(b"")
    (root / "empty-dir").mkdir()
    return root


def _flip_byte(store: FsspecArtifactStore, path: str, needle: bytes | None = None) -> None:
    data = bytearray(store.fs.cat_file(path))
    offset = data.index(needle) if needle else len(data) // 2
    data[offset] ^= 0xFF
    store.fs.pipe_file(path, bytes(data))


def _tmp_entries(store: FsspecArtifactStore) -> list[str]:
    return [str(p) for p in store.fs.find(f"{store.root}/tmp")]


def test_put_bytes_then_read_and_info(artifact_store: FsspecArtifactStore) -> None:
    data = b"some weights"
    digest = artifact_store.put_bytes(data, "blob", {"source": "test"})
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert artifact_store.exists(digest)
    assert artifact_store.read_bytes(digest) == data
    info = artifact_store.info(digest)
    assert (info.kind, info.layout, info.size_bytes, dict(info.meta)) == (
        "blob",
        "file",
        len(data),
        {"source": "test"},
    )
    assert info.uri.endswith(digest.removeprefix("sha256:"))
    assert artifact_store.materialize(digest).read_bytes() == data
    assert _tmp_entries(artifact_store) == []


def test_layout_is_content_addressed(artifact_store: FsspecArtifactStore) -> None:
    digest = artifact_store.put_bytes(b"x", "blob")
    hex_ = digest.removeprefix("sha256:")
    assert artifact_store.object_path(digest) == f"{artifact_store.root}/sha256/{hex_[:2]}/{hex_}"
    assert artifact_store.fs.exists(artifact_store.object_path(digest) + ".json")


def test_put_is_idempotent_and_does_not_rewrite(artifact_store: FsspecArtifactStore) -> None:
    digest = artifact_store.put_bytes(b"same", "blob", {"n": 1})
    path = artifact_store.object_path(digest)
    before = (artifact_store.fs.modified(path), artifact_store.info(digest))
    assert artifact_store.put_bytes(b"same", "other-kind", {"n": 2}) == digest
    assert (artifact_store.fs.modified(path), artifact_store.info(digest)) == before
    assert [info.digest for info in artifact_store.list()] == [digest]


def test_put_file(artifact_store: FsspecArtifactStore, tmp_path: Path) -> None:
    source = tmp_path / "weights.safetensors"
    source.write_bytes(b"\x00\x01" * 100_000)
    digest = artifact_store.put_file(source, "weights")
    assert digest == "sha256:" + hashlib.sha256(source.read_bytes()).hexdigest()
    assert artifact_store.put_bytes(source.read_bytes(), "weights") == digest
    copy = artifact_store.materialize(digest, tmp_path / "out" / "w.safetensors")
    assert copy.read_bytes() == source.read_bytes()
    with pytest.raises(InvalidInputError, match="not a regular file"):
        artifact_store.put_file(tmp_path, "weights")


def test_corrupt_file_is_detected_on_read_and_materialize(
    artifact_store: FsspecArtifactStore,
) -> None:
    digest = artifact_store.put_bytes(b"precious bytes" * 100, "blob")
    _flip_byte(artifact_store, artifact_store.object_path(digest))
    with pytest.raises(ArtifactCorruptError, match="is corrupt"):
        artifact_store.read_bytes(digest)
    with pytest.raises(ArtifactCorruptError, match="is corrupt"):
        artifact_store.materialize(digest)
    assert list(artifact_store.cache_dir.glob("*")) == []  # no copy, no staging left


def test_directory_digest_equals_tree_digest(
    artifact_store: FsspecArtifactStore, adapter_dir: Path
) -> None:
    digest = artifact_store.put_dir(adapter_dir, "adapter", {"base": "tiny"})
    assert digest == tree_digest(adapter_dir)
    assert artifact_store.info(digest).layout == "dir"
    assert artifact_store.fs.exists(artifact_store.object_path(digest, "dir"))
    local = artifact_store.materialize(digest)
    assert local.is_dir() and tree_digest(local) == digest
    assert (local / "nested" / "deeper" / "notes é.txt").read_text() == "unicode name"
    assert artifact_store.put_dir(adapter_dir, "adapter") == digest
    assert len(artifact_store.read_bytes(digest)) == artifact_store.info(digest).size_bytes


def test_directory_archive_is_deterministic(adapter_dir: Path, tmp_path: Path) -> None:
    first = open_artifact_store(tmp_path / "a")
    second = open_artifact_store((tmp_path / "b").as_uri())
    digest = first.put_dir(adapter_dir, "adapter")
    (adapter_dir / "adapter_config.json").touch()  # a new mtime changes nothing
    assert second.put_dir(adapter_dir, "adapter") == digest
    assert first.read_bytes(digest) == second.read_bytes(digest)


def test_corrupt_directory_is_detected(
    artifact_store: FsspecArtifactStore, adapter_dir: Path
) -> None:
    digest = artifact_store.put_dir(adapter_dir, "adapter")
    _flip_byte(artifact_store, artifact_store.object_path(digest, "dir"), b"hello adapter")
    with pytest.raises(ArtifactCorruptError, match="is corrupt"):
        artifact_store.read_bytes(digest)
    with pytest.raises(ArtifactCorruptError, match="is corrupt"):
        artifact_store.materialize(digest)


def test_damaged_cached_copy_is_replaced(
    artifact_store: FsspecArtifactStore, adapter_dir: Path
) -> None:
    digest = artifact_store.put_dir(adapter_dir, "adapter")
    local = artifact_store.materialize(digest)
    (local / "adapter_config.json").write_text('{"r": 64}')
    assert artifact_store.materialize(digest) == local
    assert tree_digest(local) == digest


def test_materialize_into_dest(
    artifact_store: FsspecArtifactStore, adapter_dir: Path, tmp_path: Path
) -> None:
    digest = artifact_store.put_dir(adapter_dir, "adapter")
    dest = tmp_path / "served" / "adapter-1"
    assert artifact_store.materialize(digest, dest) == dest
    assert tree_digest(dest) == digest
    assert artifact_store.materialize(digest, dest) == dest  # already there: fine
    other = tmp_path / "other"
    other.mkdir()
    (other / "f").write_text("different")
    with pytest.raises(InvalidInputError, match="holds other content"):
        artifact_store.materialize(digest, other)
    assert [p.name for p in dest.parent.iterdir()] == ["adapter-1"]


def test_directory_with_symlink_is_refused(
    artifact_store: FsspecArtifactStore, adapter_dir: Path
) -> None:
    (adapter_dir / "link").symlink_to(adapter_dir / "adapter_config.json")
    with pytest.raises(InvalidInputError, match="symbolic link"):
        artifact_store.put_dir(adapter_dir, "adapter")
    assert artifact_store.list() == []


def test_missing_and_malformed_digests(artifact_store: FsspecArtifactStore) -> None:
    missing = "sha256:" + "0" * 64
    assert not artifact_store.exists(missing)
    for call in (
        artifact_store.read_bytes,
        artifact_store.materialize,
        artifact_store.delete,
        artifact_store.info,
    ):
        with pytest.raises(ArtifactNotFoundError, match="is not stored"):
            call(missing)
    with pytest.raises(InvalidDigestError, match="not a sha256 digest"):
        artifact_store.exists("md5:abc")
    with pytest.raises(InvalidInputError, match="kind"):
        artifact_store.put_bytes(b"x", "Bad Kind")


def test_delete(artifact_store: FsspecArtifactStore, adapter_dir: Path) -> None:
    digest = artifact_store.put_dir(adapter_dir, "adapter")
    local = artifact_store.materialize(digest)
    artifact_store.delete(digest)
    assert not artifact_store.exists(digest)
    assert not local.exists()
    assert artifact_store.list() == []


def test_gc_removes_only_unreachable_and_only_when_asked(
    artifact_store: FsspecArtifactStore, adapter_dir: Path
) -> None:
    keep_dir = artifact_store.put_dir(adapter_dir, "adapter")
    keep_file = artifact_store.put_bytes(b"harness", "harness")
    drop = {artifact_store.put_bytes(b"old-1", "harness"), artifact_store.put_bytes(b"2", "x")}
    reachable = {keep_dir, keep_file, "sha256:" + "f" * 64}

    # fresh artifacts are protected by the default minimum age
    assert collect_garbage(artifact_store, reachable, dry_run=False) == []
    assert collect_garbage(artifact_store, reachable, min_age_seconds=0) == sorted(drop)
    assert len(artifact_store.list()) == 4  # the dry run deleted nothing
    assert collect_garbage(artifact_store, reachable, dry_run=False, min_age_seconds=0) == sorted(
        drop
    )
    assert {info.digest for info in artifact_store.list()} == {keep_dir, keep_file}
    assert artifact_store.read_bytes(keep_file) == b"harness"


def test_concurrent_puts_of_the_same_content(
    artifact_store: FsspecArtifactStore, adapter_dir: Path
) -> None:
    data = bytes(range(256)) * 4096
    results: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def put(index: int) -> None:
        try:
            barrier.wait()
            if index % 2:
                results.append(artifact_store.put_bytes(data, "blob"))
            else:
                results.append(artifact_store.put_dir(adapter_dir, "adapter"))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(results)) == 2
    assert {info.digest for info in artifact_store.list()} == set(results)
    for digest in set(results):
        assert artifact_store.exists(digest)
        artifact_store.read_bytes(digest)
    assert _tmp_entries(artifact_store) == []


def test_concurrent_materialize(artifact_store: FsspecArtifactStore, adapter_dir: Path) -> None:
    digest = artifact_store.put_dir(adapter_dir, "adapter")
    paths: list[Path] = []
    barrier = threading.Barrier(6)

    def materialize() -> None:
        barrier.wait()
        paths.append(artifact_store.materialize(digest))

    threads = [threading.Thread(target=materialize) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(paths) == 6 and len(set(paths)) == 1
    assert tree_digest(paths[0]) == digest
    assert [p.name for p in artifact_store.cache_dir.iterdir()] == [paths[0].name]

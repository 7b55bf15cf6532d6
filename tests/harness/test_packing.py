"""Deterministic packing and safe unpacking of real .tar.gz archives."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from reef.core.errors import InvalidInputError
from reef.harness import (
    Bundle,
    InvalidHarnessError,
    UnsafeBundleError,
    bundle_digest,
    harness_yaml,
    load_bundle,
    pack_bundle,
    read_bundle_archive,
    unpack_bundle,
    write_bundle,
)
from tests.harness.archives import harness_entry, tar_entry, tar_gz


def test_pack_is_deterministic(bundle: Bundle, tmp_path: Path) -> None:
    first = pack_bundle(bundle)
    assert first == pack_bundle(bundle)
    assert first[4:8] == b"\0\0\0\0"  # gzip mtime 0
    # through a directory with other timestamps, in another process
    write_bundle(bundle, tmp_path / "b")
    for path in (tmp_path / "b").rglob("*"):
        path.touch()
    assert pack_bundle(load_bundle(tmp_path / "b")) == first
    code = (
        "import sys, hashlib; from pathlib import Path; "
        "from reef.harness import load_bundle, pack_bundle; "
        "print(hashlib.sha256(pack_bundle(load_bundle(Path(sys.argv[1])))).hexdigest())"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "b")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert other.stdout.strip() == hashlib.sha256(first).hexdigest()


def test_pack_layout(bundle: Bundle) -> None:
    with tarfile.open(fileobj=io.BytesIO(pack_bundle(bundle)), mode="r:gz") as archive:
        members = archive.getmembers()
        assert [m.name for m in members] == [
            "harness.yaml",
            "README.md",
            "files/data/cities.csv",
            "skills/weather.md",
        ]
        assert {(m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {
            (0o644, 0, 0, 0, "", "")
        }
        yaml_file = archive.extractfile("harness.yaml")
        assert yaml_file is not None and yaml_file.read() == harness_yaml(bundle.harness)


def test_unpack_round_trips(bundle: Bundle, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    unpacked = unpack_bundle(pack_bundle(bundle), dest)
    assert unpacked == bundle
    assert bundle_digest(load_bundle(dest)) == bundle_digest(bundle)
    assert read_bundle_archive(pack_bundle(bundle)) == bundle


def test_unpack_accepts_a_tar_clitar_gz(bundle: Bundle, tmp_path: Path) -> None:
    write_bundle(bundle, tmp_path / "src")
    archive = tmp_path / "b.tar.gz"
    subprocess.run(["tar", "-C", str(tmp_path / "src"), "-czf", str(archive), "."], check=True)
    assert unpack_bundle(archive.read_bytes(), tmp_path / "out") == bundle


REFUSALS = [
    (
        "absolute",
        [harness_entry(), (tar_entry("/etc/cron.d/x"), b"x")],
        "'/etc/cron.d/x': absolute path",
    ),
    ("dotdot", [harness_entry(), (tar_entry("../escape"), b"x")], "'../escape': '..' in path"),
    (
        "nested-dotdot",
        [harness_entry(), (tar_entry("a/../../b"), b"x")],
        "'a/../../b': '..' in path",
    ),
    (
        "symlink",
        [harness_entry(), (tar_entry("link", tarfile.SYMTYPE, "/etc/passwd"), b"")],
        "'link': symbolic links are not allowed",
    ),
    (
        "hardlink",
        [harness_entry(), (tar_entry("hard", tarfile.LNKTYPE, "harness.yaml"), b"")],
        "'hard': hard links are not allowed",
    ),
    ("device", [harness_entry(), (tar_entry("dev", tarfile.CHRTYPE), b"")], "'dev': device files"),
    (
        "block-device",
        [harness_entry(), (tar_entry("blk", tarfile.BLKTYPE), b"")],
        "'blk': device files",
    ),
    (
        "fifo",
        [harness_entry(), (tar_entry("pipe", tarfile.FIFOTYPE), b"")],
        "'pipe': FIFOs are not allowed",
    ),
    ("duplicate", [harness_entry(), harness_entry()], "'harness.yaml': duplicate name"),
    (
        "file-as-parent",
        [harness_entry(), (tar_entry("a"), b"x"), (tar_entry("a/b"), b"y")],
        "'a/b': its parent 'a' is a file",
    ),
    ("backslash", [harness_entry(), (tar_entry("a\\..\\b"), b"x")], "backslash"),
    ("no-harness", [(tar_entry("other.txt"), b"x")], "holds no harness.yaml"),
]


@pytest.mark.parametrize(
    ("entries", "message"),
    [pytest.param(entries, message, id=case) for case, entries, message in REFUSALS],
)
def test_unsafe_archives_are_refused_clearly(
    entries: list[tuple[tarfile.TarInfo, bytes]], message: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        unpack_bundle(tar_gz(*entries), tmp_path / "out")
    assert isinstance(caught.value, UnsafeBundleError | InvalidHarnessError)
    assert message in caught.value.message
    assert list(tmp_path.iterdir()) == []  # nothing extracted, no staging left


def test_oversize_is_refused(tmp_path: Path) -> None:
    big = tar_gz(harness_entry(), (tar_entry("weights.bin"), b"\0" * 5000))
    with pytest.raises(UnsafeBundleError, match=r"'weights\.bin': bundle exceeds 4096 bytes"):
        unpack_bundle(big, tmp_path / "out", max_bytes=4096)
    huge_claim = tar_gz(harness_entry(), (tar_entry("zeros"), b"\0" * (2 * 1024 * 1024)))
    assert len(huge_claim) < 10_000
    with pytest.raises(UnsafeBundleError, match="'zeros': bundle exceeds"):
        unpack_bundle(huge_claim, tmp_path / "out", max_bytes=1024 * 1024)
    assert list(tmp_path.iterdir()) == []


def test_too_many_files_is_refused(tmp_path: Path) -> None:
    entries = [harness_entry(), *[(tar_entry(f"f{i}"), b"x") for i in range(5)]]
    with pytest.raises(UnsafeBundleError, match="'f2': more than 3 files"):
        unpack_bundle(tar_gz(*entries), tmp_path / "out", max_files=3)


def test_gzip_bomb_is_stopped_while_decompressing(tmp_path: Path) -> None:
    # No member is large: the bytes hide in a PAX header, which only the decompressed
    # byte count can catch.
    bomb = tar_gz(harness_entry(), pax={"comment": "A" * (8 * 1024 * 1024)})
    assert len(bomb) < 20_000
    with pytest.raises(UnsafeBundleError, match="decompresses to more than"):
        unpack_bundle(bomb, tmp_path / "out", max_bytes=1024 * 1024, max_files=10)


def test_not_a_tar_gz_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeBundleError, match=r"not a valid \.tar\.gz"):
        unpack_bundle(b"definitely not gzip", tmp_path / "out")
    truncated = tar_gz(harness_entry(), (tar_entry("a"), b"x" * 10_000))[:-20]
    with pytest.raises(UnsafeBundleError, match=r"not a valid \.tar\.gz"):
        unpack_bundle(truncated, tmp_path / "out")


def test_unpack_into_a_non_empty_directory_is_refused(bundle: Bundle, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("mine")
    with pytest.raises(InvalidInputError, match="not empty"):
        unpack_bundle(pack_bundle(bundle), tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep"]

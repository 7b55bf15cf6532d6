"""The archive format of directory artifacts: one uncompressed, deterministic tar.

Members are the directory's regular files only, in ``tree_digest`` order (relative
posix paths ascending by UTF-8 bytes), each with mode 0644, uid/gid 0, no owner names
and mtime 0; directories are implied. Because the order is canonical, the tree digest is
computed in one streaming pass over the archive, without extracting it.
An archive that breaks any of these rules is treated as corrupt.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO

from reef.core.digests import tree_files
from reef.core.errors import InvalidInputError
from reef.releases.artifacts import ArtifactCorruptError

_CHUNK = 1 << 20


class TreeHasher:
    """Feeds files in canonical order and yields the same digest as ``tree_digest``."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._last: bytes | None = None

    def start_file(self, relative: str, size: int) -> None:
        """Begin the file ``relative`` of ``size`` bytes; raises ``ValueError`` when
        paths do not strictly ascend (out of order or repeated)."""
        key = relative.encode("utf-8")
        if self._last is not None and key <= self._last:
            raise ValueError(f"{relative!r} is out of order or repeated")
        self._last = key
        self._hash.update(key + b"\0" + str(size).encode("ascii") + b"\0")

    def update(self, chunk: bytes) -> None:
        """Add file content."""
        self._hash.update(chunk)

    def digest(self) -> str:
        """``"sha256:<hex>"`` of everything fed so far."""
        return "sha256:" + self._hash.hexdigest()


def _copy(source: IO[bytes], sinks: tuple[TreeHasher, IO[bytes]] | TreeHasher) -> int:
    hasher, out = sinks if isinstance(sinks, tuple) else (sinks, None)
    total = 0
    while chunk := source.read(_CHUNK):
        hasher.update(chunk)
        if out is not None:
            out.write(chunk)
        total += len(chunk)
    return total


def write_tree_archive(directory: Path, out: IO[bytes]) -> str:
    """Write ``directory`` as a canonical archive to ``out``; return the tree digest of
    what was written. Raises ``InvalidInputError`` (via ``UnsafeTreeError``) for a missing
    directory or a symbolic link, and when a file changes size while being archived."""
    hasher = TreeHasher()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        for relative, full in tree_files(directory):
            with full.open("rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                info = tarfile.TarInfo(relative)
                info.size, info.mode, info.mtime = size, 0o644, 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                hasher.start_file(relative, size)
                reader = _SizedReader(handle, size, hasher, relative)
                archive.addfile(info, reader)
                reader.finish()
    return hasher.digest()


class _SizedReader:
    """Reads exactly ``size`` bytes for ``tarfile`` while hashing them; a file that grew
    or shrank since its size was taken is refused."""

    def __init__(self, handle: IO[bytes], size: int, hasher: TreeHasher, name: str) -> None:
        self._handle, self._left, self._hasher, self._name = handle, size, hasher, name

    def read(self, n: int = -1) -> bytes:
        want = self._left if n < 0 else min(n, self._left)
        chunk = self._handle.read(want)
        if len(chunk) != want:
            raise InvalidInputError(f"{self._name!r} changed while being stored")
        self._left -= len(chunk)
        self._hasher.update(chunk)
        return chunk

    def finish(self) -> None:
        if self._handle.read(1):
            raise InvalidInputError(f"{self._name!r} changed while being stored")


def _member_path(member: tarfile.TarInfo) -> str:
    """The member's relative path, or raise ``ArtifactCorruptError`` for anything but a
    plain relative regular file (absolute, ``..``, links, devices)."""
    name = member.name
    parts = PurePosixPath(name).parts
    if not member.isreg():
        raise ArtifactCorruptError(f"directory archive holds a non-file entry {name!r}")
    if not parts or name.startswith("/") or any(p in ("..", ".", "") for p in parts):
        raise ArtifactCorruptError(f"directory archive holds an unsafe path {name!r}")
    if PurePosixPath(*parts).as_posix() != name:
        raise ArtifactCorruptError(f"directory archive holds a non-canonical path {name!r}")
    return name


def _members(archive: tarfile.TarFile) -> Iterator[tuple[str, tarfile.TarInfo, IO[bytes]]]:
    last: bytes | None = None
    for member in archive:
        relative = _member_path(member)
        key = relative.encode("utf-8")
        if last is not None and key <= last:
            raise ArtifactCorruptError(f"directory archive: {relative!r} is out of order")
        last = key
        handle = archive.extractfile(member)
        if handle is None:  # pragma: no cover - isreg() guarantees a handle
            raise ArtifactCorruptError(f"directory archive: unreadable entry {relative!r}")
        yield relative, member, handle


def archive_tree_digest(source: IO[bytes]) -> str:
    """The tree digest of the canonical archive read from ``source``. Raises
    ``ArtifactCorruptError`` when the archive is unreadable or not canonical."""
    hasher = TreeHasher()
    try:
        with tarfile.open(fileobj=source, mode="r|") as archive:
            for relative, member, handle in _members(archive):
                hasher.start_file(relative, member.size)
                _copy(handle, hasher)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArtifactCorruptError(f"directory archive is unreadable: {exc}") from exc
    return hasher.digest()


def extract_tree_archive(source: IO[bytes], dest: Path) -> str:
    """Extract the canonical archive from ``source`` into the empty directory ``dest``;
    return the tree digest of what was extracted (the caller compares it). Raises
    ``ArtifactCorruptError`` when the archive is unreadable or not canonical."""
    hasher = TreeHasher()
    try:
        with tarfile.open(fileobj=source, mode="r|") as archive:
            for relative, member, handle in _members(archive):
                target = dest.joinpath(*PurePosixPath(relative).parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                hasher.start_file(relative, member.size)
                with target.open("xb") as out:
                    _copy(handle, (hasher, out))
    except (tarfile.TarError, EOFError) as exc:
        raise ArtifactCorruptError(f"directory archive is unreadable: {exc}") from exc
    except (FileExistsError, NotADirectoryError) as exc:
        raise ArtifactCorruptError(f"directory archive has clashing paths: {exc}") from exc
    return hasher.digest()

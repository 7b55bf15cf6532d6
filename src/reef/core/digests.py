"""The canonical digest of a directory tree, shared by the engine (adapter checks) and
the release system (content-addressed artifacts), so both always agree.

The digest is ``"sha256:" + hex`` of one sha256 stream fed, for every regular file below
the directory in ascending order of its relative path (``/`` separators, compared as
UTF-8 bytes)::

    path_bytes + b"\\0" + str(size).encode("ascii") + b"\\0" + file_bytes

Directories themselves, timestamps and permissions do not count; an empty directory
contributes nothing. Symbolic links are refused, never followed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from reef.core.errors import InvalidInputError

_CHUNK = 1 << 20


class UnsafeTreeError(InvalidInputError):
    """The directory is missing or holds something other than regular files and dirs."""


def tree_files(path: Path) -> list[tuple[str, Path]]:
    """Every regular file below ``path`` as ``(relative posix path, absolute path)``,
    sorted by the relative path's UTF-8 bytes. Raises ``UnsafeTreeError`` when ``path``
    is not a directory or holds a symbolic link."""
    if not path.is_dir():
        raise UnsafeTreeError(f"{str(path)!r} is not a directory")
    found: list[tuple[str, Path]] = []
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            if Path(root, name).is_symlink():
                raise UnsafeTreeError(f"{str(path)!r} holds a symbolic link: {name!r}")
        for name in files:
            full = Path(root, name)
            found.append((full.relative_to(path).as_posix(), full))
    found.sort(key=lambda item: item[0].encode("utf-8"))
    return found


def tree_digest(path: Path | str) -> str:
    """The canonical digest of a directory, ``"sha256:<64 hex>"`` (see module docstring)."""
    digest = hashlib.sha256()
    for relative, full in tree_files(Path(path)):
        digest.update(relative.encode("utf-8") + b"\0")
        digest.update(str(full.stat().st_size).encode("ascii") + b"\0")
        with full.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()

"""Adapter directory checks and the canonical adapter digest.

This module loads no torch: the release system computes the same digest without it.

The digest of a directory is ``"sha256:" + hex`` of one sha256 stream fed, for every
regular file below the directory in ascending order of its relative path (``/``
separators, compared as UTF-8 bytes)::

    path_bytes + b"\\0" + str(size).encode("ascii") + b"\\0" + file_bytes

where ``path_bytes`` is the UTF-8 relative path and ``size`` the file's byte length in
decimal. Directories themselves, timestamps and permissions do not count; an empty
directory contributes nothing. Symbolic links are refused, never followed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from reef.engine.errors import AdapterRejectedError

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib"})
"""File suffixes that may hold pickled Python objects; an adapter holding one is refused."""

_CHUNK = 1 << 20


def adapter_files(path: Path) -> list[tuple[str, Path]]:
    """Every regular file below ``path`` as ``(relative posix path, absolute path)``,
    sorted by the relative path's UTF-8 bytes.

    Raises ``AdapterRejectedError`` when ``path`` is not a directory or holds a symlink.
    """
    if not path.is_dir():
        raise AdapterRejectedError(f"adapter path {str(path)!r} is not a directory")
    found: list[tuple[str, Path]] = []
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            full = Path(root, name)
            if full.is_symlink():
                raise AdapterRejectedError(f"adapter holds a symbolic link: {name!r}")
        for name in files:
            full = Path(root, name)
            found.append((full.relative_to(path).as_posix(), full))
    found.sort(key=lambda item: item[0].encode("utf-8"))
    return found


def adapter_digest(path: Path | str) -> str:
    """The canonical digest of an adapter directory, ``"sha256:<64 hex>"``.

    See the module docstring for the exact algorithm. Raises ``AdapterRejectedError``
    when ``path`` is not a directory or holds a symbolic link.
    """
    digest = hashlib.sha256()
    for relative, full in adapter_files(Path(path)):
        digest.update(relative.encode("utf-8") + b"\0")
        digest.update(str(full.stat().st_size).encode("ascii") + b"\0")
        with full.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def check_adapter_directory(path: Path, expected_digest: str | None = None) -> str:
    """Refuse anything but a safetensors LoRA adapter; return its digest.

    The directory must hold ``adapter_config.json`` and ``adapter_model.safetensors``
    and no file with a pickle suffix (:data:`PICKLE_SUFFIXES`). When ``expected_digest``
    is given it must equal :func:`adapter_digest`. Raises ``AdapterRejectedError``.
    """
    files = adapter_files(path)
    pickles = [rel for rel, _ in files if Path(rel).suffix.lower() in PICKLE_SUFFIXES]
    if pickles:
        raise AdapterRejectedError(
            f"adapter {str(path)!r} holds pickle files {pickles}; only safetensors are loaded"
        )
    names = {rel for rel, _ in files}
    for required in ("adapter_config.json", "adapter_model.safetensors"):
        if required not in names:
            raise AdapterRejectedError(f"adapter {str(path)!r} has no {required}")
    digest = adapter_digest(path)
    if expected_digest is not None and expected_digest != digest:
        raise AdapterRejectedError(
            f"adapter digest mismatch: expected {expected_digest}, found {digest}"
        )
    return digest

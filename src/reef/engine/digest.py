"""Adapter directory checks and the canonical adapter digest.

This module loads no torch. The digest algorithm lives in ``reef.core.digests`` so the
release system computes exactly the same digest.
"""

from __future__ import annotations

from pathlib import Path

from reef.core.digests import UnsafeTreeError, tree_digest, tree_files
from reef.engine.errors import AdapterRejectedError

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib"})
"""File suffixes that may hold pickled Python objects; an adapter holding one is refused."""


def adapter_files(path: Path) -> list[tuple[str, Path]]:
    """Every regular file below ``path`` as ``(relative posix path, absolute path)``,
    sorted by the relative path's UTF-8 bytes.

    Raises ``AdapterRejectedError`` when ``path`` is not a directory or holds a symlink.
    """
    try:
        return tree_files(path)
    except UnsafeTreeError as exc:
        raise AdapterRejectedError(f"adapter {exc.message}") from exc


def adapter_digest(path: Path | str) -> str:
    """The canonical digest of an adapter directory, ``"sha256:<64 hex>"``
    (``reef.core.digests.tree_digest``). Raises ``AdapterRejectedError`` when ``path``
    is not a directory or holds a symbolic link.
    """
    try:
        return tree_digest(path)
    except UnsafeTreeError as exc:
        raise AdapterRejectedError(f"adapter {exc.message}") from exc


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

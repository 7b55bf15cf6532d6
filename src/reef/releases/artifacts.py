"""The content-addressed artifact store contract, its values and errors, and garbage
collection.

An artifact is either one file (its digest is the sha256 of its bytes) or a directory
(its digest is ``reef.core.digests.tree_digest``, the digest the engine checks adapters
against). Digests are ``"sha256:<64 lowercase hex>"``. Storing the same content twice
gives the same digest and writes nothing the second time.
"""

from __future__ import annotations

import builtins
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from reef.core.errors import InvalidInputError, NotFoundError, ReefError

ArtifactLayout = Literal["file", "dir"]

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_KIND = re.compile(r"[a-z][a-z0-9_-]{0,39}")

DEFAULT_GC_MIN_AGE_SECONDS = 3600.0
"""Artifacts younger than this are never collected: a learner stores its adapter before
the candidate that references it exists, and must not lose it in between."""


class ArtifactNotFoundError(NotFoundError):
    """No artifact with that digest is stored."""


class ArtifactCorruptError(ReefError):
    """Stored bytes no longer match their digest (or a stored directory archive is
    unreadable). Nothing was returned or materialized."""


class ArtifactTransferError(ReefError):
    """A remote artifact could not be fetched whole after every retry; what arrived is
    kept, and the next ``materialize`` continues from there."""


class InvalidDigestError(InvalidInputError):
    """A digest string is not ``"sha256:<64 lowercase hex>"``."""


def digest_hex(digest: str) -> str:
    """The 64 hex digits of ``digest``; raises ``InvalidDigestError`` when malformed."""
    match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        raise InvalidDigestError(f"not a sha256 digest: {digest!r} (want 'sha256:<64 hex>')")
    return match.group(1)


def check_kind(kind: str) -> str:
    """Return ``kind`` when it is a valid artifact kind (``[a-z][a-z0-9_-]{0,39}``, e.g.
    ``adapter``, ``harness``); raises ``InvalidInputError`` otherwise."""
    if not isinstance(kind, str) or _KIND.fullmatch(kind) is None:
        raise InvalidInputError(
            f"artifact kind {kind!r} is invalid: use 1-40 of [a-z0-9_-], starting with a letter"
        )
    return kind


@dataclass(frozen=True)
class ArtifactInfo:
    """What the store knows about one artifact (a row of the ``artifacts`` table)."""

    digest: str
    kind: str
    layout: ArtifactLayout
    size_bytes: int
    """Bytes the stored object occupies (for a directory: its archive)."""
    created_at: datetime
    uri: str
    """Where the object lives, as a URL of the store's filesystem."""
    meta: Mapping[str, Any] = field(default_factory=dict)


class ArtifactStore(ABC):
    """Content-addressed storage of files and directories.

    Implementations must make every write atomic (a reader sees the whole artifact or
    none of it), every put idempotent, and every read verified against the digest.
    """

    @abstractmethod
    def put_bytes(self, data: bytes, kind: str, meta: Mapping[str, Any] | None = None) -> str:
        """Store ``data`` as a file artifact; return its digest. Raises
        ``InvalidInputError`` for a bad ``kind`` or unserializable ``meta``."""

    @abstractmethod
    def put_file(self, path: Path, kind: str, meta: Mapping[str, Any] | None = None) -> str:
        """Store the regular file at ``path``; return the sha256 of its bytes. Raises
        ``InvalidInputError`` when ``path`` is not a regular file or changed while read."""

    @abstractmethod
    def put_dir(self, path: Path, kind: str, meta: Mapping[str, Any] | None = None) -> str:
        """Store the directory tree at ``path``; return its ``tree_digest``. Raises
        ``InvalidInputError`` when ``path`` is not a directory, holds a symbolic link, or
        changed while read."""

    @abstractmethod
    def exists(self, digest: str) -> bool:
        """Whether an artifact with ``digest`` is stored (not verified)."""

    @abstractmethod
    def info(self, digest: str) -> ArtifactInfo:
        """What is known about ``digest``; raises ``ArtifactNotFoundError``."""

    @abstractmethod
    def read_bytes(self, digest: str) -> bytes:
        """The artifact's bytes, verified (a directory comes back as its archive).
        Raises ``ArtifactNotFoundError`` or ``ArtifactCorruptError``."""

    @abstractmethod
    def materialize(self, digest: str, dest: Path | None = None) -> Path:
        """A verified local copy: a file for a file artifact, a directory for a directory
        artifact. Without ``dest`` the copy lives in the store's local cache and is
        re-verified on every call (a damaged copy is replaced). With ``dest`` (which must
        not exist, or already hold exactly this content) it is written there atomically.
        Raises ``ArtifactNotFoundError``, ``ArtifactCorruptError``, ``InvalidInputError``."""

    @abstractmethod
    def delete(self, digest: str) -> None:
        """Remove the artifact and its cached copy; raises ``ArtifactNotFoundError``."""

    @abstractmethod
    def list(self) -> builtins.list[ArtifactInfo]:
        """Every stored artifact, sorted by digest."""


def collect_garbage(
    store: ArtifactStore,
    reachable: set[str],
    dry_run: bool = True,
    *,
    min_age_seconds: float = DEFAULT_GC_MIN_AGE_SECONDS,
    now: datetime | None = None,
) -> list[str]:
    """The digests of unreachable artifacts, sorted; deleted only when ``dry_run`` is
    false.

    An artifact is kept when its digest is in ``reachable`` (the caller passes every
    digest a release or a live candidate references) or when it is younger than
    ``min_age_seconds`` (it may belong to a candidate being created right now).
    """
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=min_age_seconds)
    doomed = [
        info.digest
        for info in store.list()
        if info.digest not in reachable and info.created_at <= cutoff
    ]
    if not dry_run:
        for digest in doomed:
            try:
                store.delete(digest)
            except ArtifactNotFoundError:
                continue  # another collector got there first; the outcome is the same
    return doomed

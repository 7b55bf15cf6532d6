"""``FsspecArtifactStore``: the artifact store on any fsspec filesystem.

Layout under the store's root (a local directory, ``file:///…``, ``memory://…``,
``s3://…`` with s3fs installed, …)::

    sha256/<aa>/<hex>        a file artifact: its bytes (<aa> = first two hex digits)
    sha256/<aa>/<hex>.tar    a directory artifact: its canonical archive (artifacts_tar)
    sha256/<aa>/<hex>.json   sidecar: schema_version, kind, layout, size, created_at, meta
    tmp/<uuid>               writes in progress
    tmp/up-<hex>/part-NNNNN  a remote upload's parts (and their .sha256), until joined

The address depends on the digest only, so ``exists``/``read_bytes``/``delete`` need no
kind; the kind lives in the sidecar. Every write goes to ``tmp/`` first and is then
moved into place (a rename on local disks; on ``memory://`` the move installs the
finished object in one step). The sidecar is installed before the object, so a visible
object always has its sidecar. Materialized copies are cached under ``materialized/``
of a local root, else under ``$XDG_CACHE_HOME/reef/artifacts``.

Downloads from a remote store (anything but a local directory or ``memory://``) resume:
the object's bytes go to ``<cache>/.partial/<hex>`` (locked while written), a transfer
cut midway continues from the bytes already there (a ranged read from that offset, up
to :data:`FETCH_ATTEMPTS` tries, each after the backoff an upload's part waits too), and
a call after a failed one picks up the same partial file. Only the whole, verified copy
is ever published; a partial that does not verify is deleted, so the next call starts
afresh.

Uploads to a remote store resume too (``reef.releases.artifacts_upload``): the object
is sent in parts of 64 MiB to ``tmp/up-<hex>/``, a part that fails is sent again, and
a ``put_*`` after a failed one sends only the parts still missing; the parts are then
joined into the one object (server-side where the filesystem has ``merge``, as s3fs
does; else copied through) and installed as any write is. A local or ``memory://``
store writes the object to ``tmp/`` in one go.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import io
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, cast

from fsspec.core import url_to_fs  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict

from reef.core.digests import UnsafeTreeError, tree_digest
from reef.core.errors import InvalidInputError
from reef.core.jsoncodec import dumps
from reef.core.retrying import BlockingSleep
from reef.releases.artifacts import (
    ArtifactCorruptError,
    ArtifactInfo,
    ArtifactLayout,
    ArtifactNotFoundError,
    ArtifactStore,
    ArtifactTransferError,
    check_kind,
    digest_hex,
)
from reef.releases.artifacts_tar import (
    archive_tree_digest,
    extract_tree_archive,
    write_tree_archive,
)
from reef.releases.artifacts_upload import PartUpload, transfer_retrier

_CHUNK = 1 << 20
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FETCH_ATTEMPTS = 5
"""Tries of one remote download, each continuing where the last was cut."""

log = logging.getLogger("reef.releases.artifacts")


class ArtifactSidecar(BaseModel):
    """The ``<hex>.json`` file stored beside each artifact."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    digest: str
    kind: str
    layout: ArtifactLayout
    size_bytes: int
    created_at: datetime
    meta: dict[str, Any] = {}


def default_cache_dir() -> Path:
    """Where copies of remote artifacts are materialized when no cache is given."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "reef" / "artifacts"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _remove_local(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class FsspecArtifactStore(ArtifactStore):
    """The artifact store on the fsspec filesystem named by ``url`` (see module doc)."""

    def __init__(
        self, url: str | Path, *, cache_dir: Path | None = None, sleep: BlockingSleep = time.sleep
    ) -> None:
        self.url = str(url)
        self.sleep = sleep  # the wait before a remote transfer is tried again
        fs, root = url_to_fs(self.url)
        self.fs: Any = fs
        self.root: str = str(root).rstrip("/") or "/"
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        self.is_local = "file" in protocols or "local" in protocols
        self.is_memory = "memory" in protocols
        if cache_dir is None:
            cache_dir = Path(self.root, "materialized") if self.is_local else default_cache_dir()
        self.cache_dir = cache_dir
        self.fs.makedirs(f"{self.root}/tmp", exist_ok=True)  # noqa: S108 (a folder in the store's root, not the system /tmp)

    def __repr__(self) -> str:
        return f"FsspecArtifactStore({self.url!r})"

    # ---- addresses

    def object_path(self, digest: str, layout: ArtifactLayout = "file") -> str:
        """The filesystem path (no protocol) of the object for ``digest``."""
        hex_ = digest_hex(digest)
        base = f"{self.root}/sha256/{hex_[:2]}/{hex_}"
        return base if layout == "file" else base + ".tar"

    def _sidecar_path(self, digest: str) -> str:
        return self.object_path(digest) + ".json"

    def _locate(self, digest: str) -> tuple[str, ArtifactLayout] | None:
        for layout in ("file", "dir"):
            path = self.object_path(digest, layout)
            if self.fs.exists(path):
                return path, layout
        return None

    def _require(self, digest: str) -> tuple[str, ArtifactLayout]:
        found = self._locate(digest)
        if found is None:
            raise ArtifactNotFoundError(f"artifact {digest} is not stored in {self.url}")
        return found

    # ---- writing

    def _tmp_path(self) -> str:
        return f"{self.root}/tmp/{uuid.uuid4().hex}"  # noqa: S108 (a folder in the store's root, not the system /tmp)

    def _write_object(self, digest: str, produce: Callable[[Any], None]) -> str:
        """A ``tmp/`` path holding the bytes ``produce(out)`` writes: written in one go
        to a local or memory store, sent in parts (resumable) to a remote one."""
        tmp = self._tmp_path()
        try:
            if self.is_local or self.is_memory:
                with self.fs.open(tmp, "wb") as out:
                    produce(out)
                return tmp
            upload = PartUpload(self.fs, self._upload_folder(digest), sleep=self.sleep)
            produce(upload)
            parts = upload.finish()
            if upload.kept:
                log.info(
                    "upload of %s resumed: %d parts were stored already, %d sent",
                    digest, upload.kept, upload.sent,
                )  # fmt: skip
            self._join(parts, tmp)
            return tmp
        except BaseException:
            self._discard(tmp)
            raise

    def _upload_folder(self, digest: str) -> str:
        return f"{self.root}/tmp/up-{digest_hex(digest)}"  # noqa: S108 (the store's own tmp/)

    def _join(self, parts: builtins.list[str], tmp: str) -> None:
        if len(parts) == 1:
            self.fs.copy(parts[0], tmp)
        elif hasattr(self.fs, "merge"):  # s3fs, gcsfs: joined by the server
            self.fs.merge(tmp, parts)
        else:
            with self.fs.open(tmp, "wb") as out:
                for part in parts:
                    with self.fs.open(part, "rb") as source:
                        shutil.copyfileobj(source, out, _CHUNK)

    def _forget_upload(self, digest: str) -> None:
        if not (self.is_local or self.is_memory):
            with contextlib.suppress(FileNotFoundError, OSError):
                self.fs.rm(self._upload_folder(digest), recursive=True)

    def _install(self, tmp: str, final: str) -> None:
        self.fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
        self.fs.mv(tmp, final)

    def _discard(self, tmp: str) -> None:
        with contextlib.suppress(FileNotFoundError, OSError):
            self.fs.rm_file(tmp)

    def _store(
        self,
        digest: str,
        layout: ArtifactLayout,
        tmp: str,
        kind: str,
        meta: Mapping[str, Any] | None,
    ) -> None:
        """Install the finished ``tmp`` object: sidecar first, then the object."""
        sidecar = ArtifactSidecar(
            digest=digest,
            kind=kind,
            layout=layout,
            size_bytes=int(self.fs.size(tmp)),
            created_at=datetime.now(UTC),
            meta=dict(meta or {}),
        )
        side_tmp = self._tmp_path()
        self.fs.pipe_file(side_tmp, sidecar.model_dump_json().encode())
        self._install(side_tmp, self._sidecar_path(digest))
        self._install(tmp, self.object_path(digest, layout))

    def _check_args(self, kind: str, meta: Mapping[str, Any] | None) -> None:
        check_kind(kind)
        try:
            dumps(dict(meta or {}))
        except TypeError as exc:
            raise InvalidInputError(f"artifact meta is not JSON-serializable: {exc}") from exc

    def put_bytes(self, data: bytes, kind: str, meta: Mapping[str, Any] | None = None) -> str:
        self._check_args(kind, meta)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if self._locate(digest) is not None:
            return digest
        tmp = self._write_object(digest, lambda out: out.write(bytes(data)))
        try:
            self._store(digest, "file", tmp, kind, meta)
        finally:
            self._discard(tmp)
        self._forget_upload(digest)
        return digest

    def put_file(self, path: Path, kind: str, meta: Mapping[str, Any] | None = None) -> str:
        self._check_args(kind, meta)
        path = Path(path)
        if path.is_symlink() or not path.is_file():
            raise InvalidInputError(f"{str(path)!r} is not a regular file")
        digest = _file_sha256(path)
        if self._locate(digest) is not None:
            return digest
        copied = hashlib.sha256()

        def produce(out: Any) -> None:
            with path.open("rb") as source:
                while chunk := source.read(_CHUNK):
                    copied.update(chunk)
                    out.write(chunk)

        tmp = self._write_object(digest, produce)
        try:
            if "sha256:" + copied.hexdigest() != digest:
                raise InvalidInputError(f"{str(path)!r} changed while being stored")
            self._store(digest, "file", tmp, kind, meta)
        finally:
            self._discard(tmp)
        self._forget_upload(digest)
        return digest

    def put_dir(self, path: Path, kind: str, meta: Mapping[str, Any] | None = None) -> str:
        self._check_args(kind, meta)
        digest = tree_digest(path)
        if self._locate(digest) is not None:
            return digest
        written: builtins.list[str] = []
        tmp = self._write_object(
            digest, lambda out: written.append(write_tree_archive(Path(path), out))
        )
        try:
            if written != [digest]:
                raise InvalidInputError(f"{str(path)!r} changed while being stored")
            self._store(digest, "dir", tmp, kind, meta)
        finally:
            self._discard(tmp)
        self._forget_upload(digest)
        return digest

    # ---- reading

    def exists(self, digest: str) -> bool:
        return self._locate(digest) is not None

    def info(self, digest: str) -> ArtifactInfo:
        path, layout = self._require(digest)
        sidecar = self._read_sidecar(digest)
        if sidecar is None:  # lost sidecar: report what the object itself says
            return ArtifactInfo(
                digest=digest,
                kind="unknown",
                layout=layout,
                size_bytes=int(self.fs.size(path)),
                created_at=self._modified(path),
                uri=str(self.fs.unstrip_protocol(path)),
            )
        return ArtifactInfo(
            digest=digest,
            kind=sidecar.kind,
            layout=layout,
            size_bytes=sidecar.size_bytes,
            created_at=sidecar.created_at,
            uri=str(self.fs.unstrip_protocol(path)),
            meta=sidecar.meta,
        )

    def _read_sidecar(self, digest: str) -> ArtifactSidecar | None:
        try:
            raw = self.fs.cat_file(self._sidecar_path(digest))
            return ArtifactSidecar.model_validate_json(raw)
        except (FileNotFoundError, ValueError):
            return None

    def _modified(self, path: str) -> datetime:
        try:
            stamp = self.fs.modified(path)
        except (NotImplementedError, OSError, KeyError):
            return _EPOCH
        if isinstance(stamp, datetime):
            return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
        return _EPOCH

    def read_bytes(self, digest: str) -> bytes:
        path, layout = self._require(digest)
        data = bytes(self.fs.cat_file(path))
        if layout == "file":
            actual = "sha256:" + hashlib.sha256(data).hexdigest()
        else:
            actual = archive_tree_digest(io.BytesIO(data))
        self._check_same(digest, actual)
        return data

    def _check_same(self, digest: str, actual: str | None) -> None:
        if actual != digest:
            raise ArtifactCorruptError(
                f"artifact {digest} in {self.url} is corrupt: its content hashes to {actual}"
            )

    # ---- materializing

    def materialize(self, digest: str, dest: Path | None = None) -> Path:
        path, layout = self._require(digest)
        target = Path(dest) if dest is not None else self.cache_dir / f"sha256-{digest_hex(digest)}"
        if os.path.lexists(target):
            if _local_digest(target, layout) == digest:
                return target
            if dest is not None:
                raise InvalidInputError(f"{str(dest)!r} exists and holds other content")
            _remove_local(target)  # a damaged cached copy: fetch it again
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
        partial: Path | None = None
        try:
            if self.is_local or self.is_memory:
                with self._open_read(path) as source:
                    actual = _fetch(source, staging, layout)
            else:
                partial = self.cache_dir / ".partial" / f"sha256-{digest_hex(digest)}"
                self._download(path, partial)
                with partial.open("rb") as source:
                    actual = _fetch(source, staging, layout)
            if actual != digest and partial is not None:
                _remove_local(partial)  # the next call fetches afresh
            self._check_same(digest, actual)
            _publish(staging, target, digest, layout)
            if partial is not None:
                _remove_local(partial)
        finally:
            _remove_local(staging)
        return target

    def _open_ranged(self, path: str) -> IO[bytes]:
        """``path`` opened for reads of one chunk per request, no read-ahead (so a cut
        transfer loses at most the chunk in flight), where the filesystem supports it."""
        try:
            return cast(IO[bytes], self.fs.open(path, "rb", block_size=_CHUNK, cache_type="none"))
        except TypeError:
            return cast(IO[bytes], self.fs.open(path, "rb"))

    def _download(self, path: str, partial: Path) -> None:
        """Make ``partial`` hold every byte of the remote object at ``path``: keep what
        it holds already, read the rest from that offset, and when a read is cut, try
        again from where it stopped (:data:`FETCH_ATTEMPTS` tries in all). Raises
        ``ArtifactTransferError`` when the bytes could not all be fetched."""
        partial.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("ab") as out:
            fcntl.flock(out, fcntl.LOCK_EX)  # another process fetching it waits, then sees it
            total = int(self.fs.size(path))
            retrier = transfer_retrier(FETCH_ATTEMPTS)
            while True:
                have = out.seek(0, os.SEEK_END)
                if have > total:  # not a prefix of this object: start over
                    out.truncate(0)
                    have = 0
                if have == total:
                    return
                try:
                    with self._open_ranged(path) as source:
                        source.seek(have)
                        while chunk := source.read(min(_CHUNK, total - have)):
                            out.write(chunk)
                            have += len(chunk)
                    out.flush()
                    if have >= total:
                        return
                    raise OSError(f"the transfer ended at byte {have} of {total}")
                except Exception as exc:  # any transport's error: retried, then reported
                    out.flush()
                    log.warning(
                        "fetching %s: try %d of %d cut at byte %d of %d: %s",
                        path, retrier.attempts, FETCH_ATTEMPTS, out.tell(), total, exc,
                    )  # fmt: skip
                    error = exc
                    if not retrier.pause_blocking(sleep=self.sleep):
                        break
            raise ArtifactTransferError(
                f"could not fetch {path} after {FETCH_ATTEMPTS} tries ({error}); the "
                f"{out.tell()} bytes fetched are kept in {partial} and the next try continues"
            ) from error

    def _open_read(self, path: str) -> IO[bytes]:
        # memory:// hands every reader the same file object (one shared position), so
        # concurrent readers each get their own copy of the bytes instead.
        if self.is_memory:
            return io.BytesIO(self.fs.cat_file(path))
        return cast(IO[bytes], self.fs.open(path, "rb"))

    # ---- deleting and listing

    def delete(self, digest: str) -> None:
        self._require(digest)
        for layout in ("file", "dir"):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self.object_path(digest, layout))
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._sidecar_path(digest))
        _remove_local(self.cache_dir / f"sha256-{digest_hex(digest)}")

    def list(self) -> builtins.list[ArtifactInfo]:
        base = f"{self.root}/sha256"
        if not self.fs.exists(base):
            return []
        digests: set[str] = set()
        for found in self.fs.find(base):
            name = str(found).rsplit("/", 1)[-1].removesuffix(".tar")
            if len(name) == 64 and all(c in "0123456789abcdef" for c in name):
                digests.add("sha256:" + name)
        infos = []
        for digest in sorted(digests):
            with contextlib.suppress(ArtifactNotFoundError):  # deleted meanwhile
                infos.append(self.info(digest))
        return infos


def _fetch(source: IO[bytes], staging: Path, layout: ArtifactLayout) -> str:
    """Copy the stored object into ``staging``; return the digest of what was written."""
    if layout == "dir":
        staging.mkdir()
        return extract_tree_archive(source, staging)
    digest = hashlib.sha256()
    with staging.open("xb") as out:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return "sha256:" + digest.hexdigest()


def _publish(staging: Path, target: Path, digest: str, layout: ArtifactLayout) -> None:
    """Move the verified ``staging`` copy to ``target``. A concurrent materializer may
    have won the race; its copy is kept when it verifies."""
    try:
        if layout == "file":
            os.replace(staging, target)
        else:
            staging.rename(target)
    except OSError:
        if _local_digest(target, layout) != digest:
            raise


def _local_digest(path: Path, layout: ArtifactLayout) -> str | None:
    try:
        if layout == "file":
            return _file_sha256(path) if path.is_file() and not path.is_symlink() else None
        return tree_digest(path) if not path.is_symlink() else None
    except (UnsafeTreeError, OSError):
        return None


def open_artifact_store(
    url_or_path: str | Path, *, cache_dir: Path | None = None, sleep: BlockingSleep = time.sleep
) -> ArtifactStore:
    """The artifact store at ``url_or_path``: a local directory path or any fsspec URL
    (``file:///…``, ``memory://…``, ``s3://…`` …). ``cache_dir`` holds materialized
    copies (default: ``materialized/`` under a local root, else the user cache);
    ``sleep`` is the wait before a cut remote transfer is tried again."""
    return FsspecArtifactStore(url_or_path, cache_dir=cache_dir, sleep=sleep)

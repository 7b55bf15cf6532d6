"""Resumable uploads to a remote artifact store: an object is sent in parts.

What is written to a ``PartUpload`` goes to ``<folder>/part-NNNNN`` in parts of
:data:`PART_BYTES` (the last one shorter), each followed by ``part-NNNNN.sha256``, the
part's digest, written only once the part is stored. A part that fails is sent again
(:data:`UPLOAD_ATTEMPTS` tries, each after a full-jitter backoff of
``reef.core.retrying`` that starts below :data:`TRANSFER_BACKOFF_SECONDS`); an upload
that fails anyway leaves the parts it stored, and the next upload of the same content
into the same folder sends only the parts whose digest file is missing or names other
bytes. The store then joins the parts into one object (server-side where the filesystem
can, as s3fs's ``merge`` does) and removes the folder. Only one part is held in memory
at a time.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from reef.core.retrying import BlockingSleep, Retrier, RetryPolicy
from reef.releases.artifacts import ArtifactTransferError

PART_BYTES = 64 << 20
"""Bytes per part: what a cut upload loses at most, and the memory one upload holds.
Above S3's 5 MiB minimum for the parts of a server-side join."""
UPLOAD_ATTEMPTS = 5
"""Tries of one part before the upload fails (and can be resumed)."""
TRANSFER_BACKOFF_SECONDS = 0.5
"""The longest wait before a transfer's first retry; each later one may wait twice as
long, up to :data:`TRANSFER_BACKOFF_CAP_SECONDS`. A store that dropped a connection is
often busy: an immediate retry meets it busy still."""
TRANSFER_BACKOFF_CAP_SECONDS = 8.0


def transfer_retrier(attempts: int) -> Retrier:
    """The retries of one artifact transfer (a part's upload, an object's download) of
    at most ``attempts`` tries."""
    policy = RetryPolicy(
        retries=attempts - 1,
        base_seconds=TRANSFER_BACKOFF_SECONDS,
        cap_seconds=TRANSFER_BACKOFF_CAP_SECONDS,
    )
    return Retrier(policy)


log = logging.getLogger("reef.releases.artifacts")


class PartUpload:
    """A write-only file object that stores what it is given as parts in ``folder`` on
    ``fs``; ``finish()`` stores the last part and returns every part's path, in order.
    ``sleep`` is the wait before a failed part is sent again."""

    def __init__(
        self,
        fs: Any,
        folder: str,
        part_bytes: int | None = None,
        *,
        sleep: BlockingSleep = time.sleep,
    ) -> None:
        self.fs = fs
        self.sleep = sleep
        self.folder = folder
        self.part_bytes = part_bytes or PART_BYTES
        self.parts: list[str] = []
        self.sent = 0  # parts stored by this upload
        self.kept = 0  # parts an earlier upload had stored already
        self._buffer = bytearray()
        fs.makedirs(folder, exist_ok=True)
        # what an earlier upload left: one listing, not a lookup per part
        try:
            listed = fs.ls(folder, detail=True)
        except (FileNotFoundError, OSError):
            listed = []
        self._found = {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: e.get("size") for e in listed}

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._buffer += data
        while len(self._buffer) >= self.part_bytes:
            self._store(bytes(self._buffer[: self.part_bytes]))
            del self._buffer[: self.part_bytes]
        return len(data)

    def finish(self) -> list[str]:
        """Store what is left (an empty object is one empty part); the parts' paths."""
        if self._buffer or not self.parts:
            self._store(bytes(self._buffer))
            self._buffer.clear()
        return list(self.parts)

    def _store(self, part: bytes) -> None:
        path = f"{self.folder}/part-{len(self.parts):05d}"
        digest = hashlib.sha256(part).hexdigest()
        self.parts.append(path)
        if self._stored_already(path, digest, len(part)):
            self.kept += 1
            return
        retrier = transfer_retrier(UPLOAD_ATTEMPTS)
        while True:
            try:
                self.fs.pipe_file(path, part)
                self.fs.pipe_file(path + ".sha256", digest.encode())
            except Exception as exc:  # any transport's error: retried, then reported
                log.warning(
                    "uploading %s: try %d of %d failed: %s",
                    path, retrier.attempts, UPLOAD_ATTEMPTS, exc,
                )  # fmt: skip
                error = exc
                if not retrier.pause_blocking(sleep=self.sleep):
                    break
            else:
                self.sent += 1
                return
        raise ArtifactTransferError(
            f"could not upload {path} after {UPLOAD_ATTEMPTS} tries ({error}); the "
            f"{len(self.parts) - 1} parts before it are kept in {self.folder}, and storing "
            "the same artifact again continues from there"
        ) from error

    def _stored_already(self, path: str, digest: str, size: int) -> bool:
        name = path.rsplit("/", 1)[-1]
        if self._found.get(name) != size or name + ".sha256" not in self._found:
            return False
        try:
            return bool(self.fs.cat_file(path + ".sha256").decode().strip() == digest)
        except (FileNotFoundError, OSError, UnicodeDecodeError):
            return False

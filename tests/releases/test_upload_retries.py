"""A part of a remote upload that fails is sent again after a backoff, never at once:
a filesystem that refuses its first writes (fsspec's in-memory one, standing in for a
busy object store) and a recorded sleep, so no test waits for real."""

from __future__ import annotations

import uuid
from typing import Any

import fsspec
import pytest

from reef.releases import ArtifactTransferError
from reef.releases.artifacts_upload import (
    TRANSFER_BACKOFF_SECONDS,
    UPLOAD_ATTEMPTS,
    PartUpload,
)


class RefusingFileSystem:
    """fsspec's in-memory filesystem, but its next ``refusals`` writes fail as a dropped
    connection would; ``events`` notes each write tried and each wait, in order."""

    def __init__(self, refusals: int, events: list[str]) -> None:
        self.memory: Any = fsspec.filesystem("memory")
        self.refusals = refusals
        self.events = events

    def __getattr__(self, name: str) -> Any:
        return getattr(self.memory, name)

    def pipe_file(self, path: str, value: bytes) -> None:
        self.events.append(f"write {path.rsplit('/', 1)[-1]}")
        if self.refusals > 0:
            self.refusals -= 1
            raise ConnectionResetError("the store dropped the connection")
        self.memory.pipe_file(path, value)


def _upload(refusals: int) -> tuple[PartUpload, list[str], list[float]]:
    events: list[str] = []
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        events.append("wait")
        waits.append(seconds)

    fs = RefusingFileSystem(refusals, events)
    return PartUpload(fs, f"/up-{uuid.uuid4().hex}", part_bytes=4, sleep=sleep), events, waits


def test_a_refused_part_is_sent_again_after_a_backoff() -> None:
    upload, events, waits = _upload(refusals=2)
    upload.write(b"abcdefg")
    assert upload.finish() == [f"{upload.folder}/part-00000", f"{upload.folder}/part-00001"]
    assert upload.fs.cat_file(f"{upload.folder}/part-00000") == b"abcd"
    first = "write part-00000"
    assert events[:5] == [first, "wait", first, "wait", first]
    assert 0 <= waits[0] <= TRANSFER_BACKOFF_SECONDS
    assert 0 <= waits[1] <= 2 * TRANSFER_BACKOFF_SECONDS
    assert upload.sent == 2


def test_a_part_refused_every_time_fails_the_upload_without_a_last_wait() -> None:
    upload, events, waits = _upload(refusals=UPLOAD_ATTEMPTS)
    with pytest.raises(ArtifactTransferError, match=f"after {UPLOAD_ATTEMPTS} tries"):
        upload.write(b"abcd")
    assert events.count("write part-00000") == UPLOAD_ATTEMPTS
    assert len(waits) == UPLOAD_ATTEMPTS - 1
    assert events[-1] == "write part-00000"  # it gave up at once after the last try

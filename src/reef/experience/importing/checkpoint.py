"""Resume points of ``reef import``: one small JSON file per (file digest, scenario,
format) under ``<home>/imports``, holding the byte offset and line number up to which
every line's rows are committed. Written after each committed batch (atomically: a
temporary file renamed over it), removed when the file is done."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

DIGEST_CHUNK = 1 << 20


def file_digest(path: Path) -> str:
    """Hex sha256 of the file's bytes, read in chunks (memory stays flat)."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(DIGEST_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    """Where an import of one file resumes: byte ``offset``, lines read before it."""

    offset: int = 0
    line: int = 0


class CheckpointFile:
    """The checkpoint of one import of one file."""

    def __init__(self, directory: Path, digest: str, scenario: str, fmt: str) -> None:
        key = hashlib.sha256(f"{scenario}\0{fmt}".encode()).hexdigest()[:12]
        self.path = directory / f"{digest}-{key}.json"

    def load(self) -> Checkpoint:
        """The saved resume point; the start of the file when none (or unreadable)."""
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8"))
            return Checkpoint(offset=int(saved["offset"]), line=int(saved["line"]))
        except (OSError, ValueError, KeyError, TypeError):
            return Checkpoint()

    def save(self, point: Checkpoint) -> None:
        """Record ``point`` (durably: written beside, then renamed over the old one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"offset": point.offset, "line": point.line}))
        os.replace(temporary, self.path)

    def clear(self) -> None:
        """Forget the resume point: the file was imported to its end."""
        self.path.unlink(missing_ok=True)

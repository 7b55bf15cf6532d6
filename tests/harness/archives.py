"""Hand-made .tar.gz archives with exactly the entries a test wants (real tarfile
output, including entries Reef's own packer never writes: links, devices, ...)."""

from __future__ import annotations

import gzip
import io
import tarfile

HARNESS = b"schema_version: 1\nsystem_prompt: hi\n"


def tar_gz(*entries: tuple[tarfile.TarInfo, bytes], pax: dict[str, str] | None = None) -> bytes:
    """A .tar.gz holding ``entries`` in order (``pax``: a global PAX header)."""
    raw = io.BytesIO()
    with tarfile.open(
        fileobj=raw, mode="w", format=tarfile.PAX_FORMAT, pax_headers=pax or {}
    ) as archive:
        for info, data in entries:
            info.size = len(data) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return gzip.compress(raw.getvalue(), mtime=0)


def tar_entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    """A header of type ``kind`` (a regular file by default)."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


def harness_entry() -> tuple[tarfile.TarInfo, bytes]:
    """A valid minimal ``harness.yaml`` entry."""
    return tar_entry("harness.yaml"), HARNESS

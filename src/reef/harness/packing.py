"""Deterministic ``.tar.gz`` packing of bundles and safe unpacking.

Packing: ``harness.yaml`` (canonical text) first, then the extra files ascending by
UTF-8 path; every entry a regular file with mode 0644, uid/gid 0, empty owner names,
mtime 0; PAX format; gzip with mtime 0, no file name, level 9. The same bundle always
packs to the same bytes (on one zlib version).

Unpacking refuses, naming the entry: absolute paths, ``..``, backslashes, symbolic and
hard links, devices, FIFOs, any other non-file entry, duplicate names, a file that is
also a directory, more than ``max_files`` files, more than ``max_bytes`` of file
content, and a stream that decompresses to more than the limits allow (gzip bombs,
oversized PAX headers). Directory entries and a leading ``./`` are accepted (what
``tar -C dir -czf b.tar.gz .`` writes).
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from pathlib import Path
from typing import IO, cast

from reef.harness.bundle import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    HARNESS_FILE,
    Bundle,
    bundle_path_problem,
    check_limits,
    harness_yaml,
    parse_harness_yaml,
    write_files,
)
from reef.harness.errors import InvalidHarnessError, UnsafeBundleError

_ENTRY_OVERHEAD = 4096
"""Decompressed bytes allowed per entry beyond its content (headers, padding)."""


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_bundle(bundle: Bundle) -> bytes:
    """The bundle as deterministic ``.tar.gz`` bytes (see module docstring)."""
    buffer = io.BytesIO()
    entries = [(HARNESS_FILE, harness_yaml(bundle.harness)), *bundle.files.items()]
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as archive,
    ):
        for name, data in entries:
            archive.addfile(_tar_info(name, len(data)), io.BytesIO(data))
    return buffer.getvalue()


class _LimitedReader:
    """Counts decompressed bytes and refuses to go past ``limit``."""

    def __init__(self, raw: gzip.GzipFile, limit: int) -> None:
        self._raw, self._limit, self._count = raw, limit, 0

    def read(self, size: int = -1) -> bytes:
        allowed = self._limit - self._count + 1
        chunk = self._raw.read(allowed if size < 0 else min(size, allowed))
        self._count += len(chunk)
        if self._count > self._limit:
            raise UnsafeBundleError(
                f"bundle archive decompresses to more than {self._limit} bytes "
                "(a gzip bomb or oversized headers)"
            )
        return chunk


def _entry_name(member: tarfile.TarInfo) -> str:
    name = member.name
    while name.startswith("./"):
        name = name[2:]
    return name


def _refuse_special(member: tarfile.TarInfo, name: str) -> None:
    kinds = [
        (member.issym(), "symbolic links are not allowed"),
        (member.islnk(), "hard links are not allowed"),
        (member.ischr() or member.isblk(), "device files are not allowed"),
        (member.isfifo(), "FIFOs are not allowed"),
        (not member.isreg(), "only regular files and directories are allowed"),
    ]
    for refused, why in kinds:
        if refused:
            raise UnsafeBundleError(f"bundle entry {name!r}: {why}")


def _check_no_file_parents(names: list[str]) -> None:
    files = set(names)
    for name in names:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in files:
                raise UnsafeBundleError(f"bundle entry {name!r}: its parent {parent!r} is a file")


def _read_members(data: bytes, max_bytes: int, max_files: int) -> dict[str, bytes]:
    if len(data) > max_bytes:
        raise UnsafeBundleError(f"bundle archive is larger than {max_bytes} bytes")
    limit = max_bytes + _ENTRY_OVERHEAD * (max_files + 1) + tarfile.RECORDSIZE
    members: dict[str, bytes] = {}
    total = 0
    with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as gz:
        reader = _LimitedReader(gz, limit)
        with tarfile.open(fileobj=cast(IO[bytes], reader), mode="r|") as archive:
            for member in archive:
                name = _entry_name(member)
                if member.isdir() and name in ("", "."):
                    continue
                problem = bundle_path_problem(name.rstrip("/") if member.isdir() else name)
                if problem is not None:
                    raise UnsafeBundleError(f"bundle entry {member.name!r}: {problem}")
                if member.isdir():
                    continue
                _refuse_special(member, name)
                if name in members:
                    raise UnsafeBundleError(f"bundle entry {name!r}: duplicate name")
                total += member.size
                check_limits(len(members) + 1, total, name, max_bytes, max_files)
                handle = archive.extractfile(member)
                members[name] = handle.read() if handle is not None else b""
    _check_no_file_parents(list(members))
    return members


def _members(data: bytes, max_bytes: int, max_files: int) -> dict[str, bytes]:
    try:
        return _read_members(data, max_bytes, max_files)
    except (gzip.BadGzipFile, zlib.error, EOFError, tarfile.TarError) as exc:
        raise UnsafeBundleError(f"bundle archive is not a valid .tar.gz: {exc}") from exc


def _bundle(members: dict[str, bytes]) -> Bundle:
    if HARNESS_FILE not in members:
        raise InvalidHarnessError(f"bundle archive holds no {HARNESS_FILE} at its top")
    files = {name: data for name, data in members.items() if name != HARNESS_FILE}
    return Bundle(parse_harness_yaml(members[HARNESS_FILE]), files)


def read_bundle_archive(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES, max_files: int = DEFAULT_MAX_FILES
) -> Bundle:
    """Parse a ``.tar.gz`` bundle in memory, with the checks of :func:`unpack_bundle`,
    writing nothing. Raises ``UnsafeBundleError`` or ``InvalidHarnessError``."""
    return _bundle(_members(data, max_bytes, max_files))


def unpack_bundle(
    data: bytes,
    dest: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> Bundle:
    """Check the ``.tar.gz`` bundle ``data`` completely, then write its entries (as
    archived) into ``dest`` through a temporary sibling directory and a rename.
    ``dest`` must not exist or be empty. Raises ``UnsafeBundleError``,
    ``InvalidHarnessError`` or ``InvalidInputError``; on any error nothing is left."""
    members = _members(data, max_bytes, max_files)
    bundle = _bundle(members)
    write_files(members, dest)
    return bundle

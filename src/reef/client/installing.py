"""Installed harnesses on an agent's machine.

Layout of an install directory ``dir``::

    releases/<release_id>/        the unpacked bundle (harness.yaml + extra files)
    releases/<release_id>.json    install record: schema_version, release_id, digest,
                                  scenario, source URL, installed_at
    current -> releases/<id>      relative symbolic link to the serving release

``current`` only ever moves by renaming a freshly made temporary link over it (one
atomic ``rename``), and only after the release is unpacked, verified and recorded; when
anything fails before that, ``current`` is untouched.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from reef.client.download import (
    check_headers,
    fetch,
    fetch_manifest,
    is_safe_release_id,
    scenario_url,
)
from reef.client.errors import (
    HarnessDigestMismatchError,
    HarnessInstallError,
    ReleaseNotInstalledError,
)
from reef.core.errors import InvalidInputError
from reef.harness import (
    DEFAULT_MAX_BYTES,
    Bundle,
    Harness,
    bundle_digest,
    load_bundle,
    read_bundle_archive,
    unpack_bundle,
)

CURRENT = "current"
RELEASES = "releases"


class InstallRecord(BaseModel):
    """``releases/<release_id>.json``: what was installed, from where."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    release_id: str
    digest: str
    scenario: str | None = None
    source: str | None = None
    installed_at: datetime


@dataclass(frozen=True)
class InstalledHarness:
    """One installed release: where it is and what it must hash to."""

    root: Path
    release_id: str
    digest: str
    path: Path

    def load(self) -> Bundle:
        """The installed bundle, verified against its recorded digest; raises
        ``HarnessDigestMismatchError`` when the files were changed since."""
        bundle = load_bundle(self.path)
        actual = bundle_digest(bundle)
        if actual != self.digest:
            raise HarnessDigestMismatchError(
                f"installed release {self.release_id!r} at {self.path} hashes to {actual}, "
                f"installed as {self.digest}"
            )
        return bundle


def _record_path(root: Path, release_id: str) -> Path:
    return root / RELEASES / f"{release_id}.json"


def installed_release(root: Path, release_id: str) -> InstalledHarness:
    """The installed release ``release_id`` under ``root``; raises
    ``ReleaseNotInstalledError``."""
    if not is_safe_release_id(release_id):
        raise InvalidInputError(f"release id {release_id!r} is not a safe directory name")
    root = Path(root)
    try:
        record = InstallRecord.model_validate_json(_record_path(root, release_id).read_bytes())
    except (FileNotFoundError, ValidationError) as exc:
        raise ReleaseNotInstalledError(
            f"release {release_id!r} is not installed in {root}"
        ) from exc
    path = root / RELEASES / release_id
    if not path.is_dir():
        raise ReleaseNotInstalledError(f"release {release_id!r} has no files in {root}")
    return InstalledHarness(root, release_id, record.digest, path)


def current_release(root: Path) -> InstalledHarness:
    """The release ``root/current`` points at; raises ``ReleaseNotInstalledError``."""
    link = Path(root) / CURRENT
    if not link.is_symlink():
        raise ReleaseNotInstalledError(f"{link} is not an installed harness link")
    return installed_release(Path(root), Path(os.readlink(link)).name)


def load_installed(root: Path) -> Harness:
    """The harness ``root/current`` points at, verified against its install record.
    Raises ``ReleaseNotInstalledError`` or ``HarnessDigestMismatchError``."""
    return current_release(root).load().harness


def _repoint(root: Path, release_id: str) -> None:
    link = root / CURRENT
    if os.path.lexists(link) and not link.is_symlink():
        raise HarnessInstallError(f"{link} exists and is not a symbolic link; not replacing it")
    temporary = root / f".{CURRENT}.tmp-{uuid.uuid4().hex}"
    os.symlink(Path(RELEASES) / release_id, temporary)
    try:
        os.replace(temporary, link)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def _write_record(root: Path, record: InstallRecord) -> None:
    target = _record_path(root, record.release_id)
    temporary = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
    temporary.write_bytes(record.model_dump_json().encode())
    os.replace(temporary, target)


def _place(data: bytes, releases: Path, release_id: str, digest: str, max_bytes: int) -> None:
    """Unpack ``data`` as ``releases/<release_id>``, replacing a damaged copy."""
    final = releases / release_id
    if final.is_dir():
        try:
            if bundle_digest(load_bundle(final)) == digest:
                return
        except InvalidInputError:
            pass  # damaged or tampered: replaced below
    staging = releases / f".{release_id}.tmp-{uuid.uuid4().hex}"
    old = releases / f".{release_id}.old-{uuid.uuid4().hex}"
    try:
        unpack_bundle(data, staging, max_bytes=max_bytes)
        if os.path.lexists(final):
            final.rename(old)
        try:
            staging.rename(final)
        except OSError:
            # a concurrent install of the same release got there first
            if bundle_digest(load_bundle(final)) != digest:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def install_harness(
    url: str,
    scenario: str,
    dir: Path,
    api_key: str | None = None,
    *,
    timeout_seconds: float = 30.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> InstalledHarness:
    """Fetch the scenario's harness from the gateway at ``url``, verify that the
    bundle's digest equals the manifest's, unpack it into ``dir/releases/<release_id>/``
    and atomically repoint ``dir/current`` at it.

    Raises ``HarnessDigestMismatchError``, ``HarnessInstallError``,
    ``HarnessUnavailableError``, ``UnauthenticatedError``, ``PermissionDeniedError``,
    ``UnsafeBundleError`` or ``InvalidHarnessError``; on any error ``current`` is
    untouched.
    """
    root = Path(dir)
    manifest = fetch_manifest(url, scenario, api_key, timeout_seconds)
    target = scenario_url(url, scenario, "harness.tar.gz")
    fetched = fetch(target, api_key, max_bytes, timeout_seconds)
    check_headers(target, fetched, manifest)
    actual = bundle_digest(read_bundle_archive(fetched.data, max_bytes=max_bytes))
    if actual != manifest.digest:
        raise HarnessDigestMismatchError(
            f"bundle from {target} hashes to {actual}, the manifest says {manifest.digest}; refused"
        )
    releases = root / RELEASES
    releases.mkdir(parents=True, exist_ok=True)
    _place(fetched.data, releases, manifest.release_id, manifest.digest, max_bytes)
    record = InstallRecord(
        release_id=manifest.release_id,
        digest=manifest.digest,
        scenario=scenario,
        source=url,
        installed_at=datetime.now(UTC),
    )
    _write_record(root, record)
    _repoint(root, manifest.release_id)
    return InstalledHarness(
        root, manifest.release_id, manifest.digest, releases / record.release_id
    )


def rollback_installed(dir: Path, release_id: str) -> InstalledHarness:
    """Repoint ``dir/current`` at the already installed ``release_id`` after verifying
    its files. Raises ``ReleaseNotInstalledError`` or ``HarnessDigestMismatchError``
    (then ``current`` is untouched)."""
    installed = installed_release(Path(dir), release_id)
    installed.load()
    _repoint(Path(dir), release_id)
    return installed

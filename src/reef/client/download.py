"""Fetching a scenario's harness from a Reef gateway (stdlib ``urllib``, no extra
dependency).

The contract (served by the gateway's admin routes):

- ``GET {url}/reef/scenarios/{scenario}/harness`` → JSON manifest with at least
  ``release_id`` and ``digest`` (the bundle digest); headers ``x-reef-release-id`` and
  ``ETag`` (the digest, quoted or not).
- ``GET {url}/reef/scenarios/{scenario}/harness.tar.gz`` → the packed bundle, with the
  same two headers.

``api_key`` is sent as ``Authorization: Bearer …``.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from reef.client.errors import HarnessInstallError, HarnessUnavailableError
from reef.core.errors import PermissionDeniedError, UnauthenticatedError

_RELEASE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MANIFEST_MAX_BYTES = 1024 * 1024


def is_safe_release_id(value: str) -> bool:
    """Whether ``value`` can name a directory: 1-128 of ``[A-Za-z0-9._-]``, starting
    with a letter or digit, no ``..``."""
    return bool(_RELEASE_ID.fullmatch(value)) and ".." not in value


class HarnessManifest(BaseModel):
    """What the manifest endpoint returns (unknown keys are ignored, for newer
    servers)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    release_id: str
    digest: str
    scenario: str | None = None

    @field_validator("release_id")
    @classmethod
    def _release_id(cls, value: str) -> str:
        if not is_safe_release_id(value):
            raise ValueError(f"release_id {value!r} is not a safe directory name")
        return value

    @field_validator("digest")
    @classmethod
    def _digest(cls, value: str) -> str:
        if not _DIGEST.fullmatch(value):
            raise ValueError(f"digest {value!r} is not 'sha256:<64 hex>'")
        return value


@dataclass(frozen=True)
class Fetched:
    """A response body and the Reef headers that came with it."""

    data: bytes
    release_id: str | None
    etag: str | None


def scenario_url(url: str, scenario: str, suffix: str) -> str:
    """``{url}/reef/scenarios/{scenario}/{suffix}`` with the scenario escaped."""
    return f"{url.rstrip('/')}/reef/scenarios/{quote(scenario, safe='')}/{suffix}"


def _etag(headers: Mapping[str, str]) -> str | None:
    value = headers.get("ETag")
    if value is None:
        return None
    return value.removeprefix("W/").strip().strip('"')


def fetch(url: str, api_key: str | None, max_bytes: int, timeout_seconds: float) -> Fetched:
    """GET ``url``; raises ``HarnessUnavailableError`` (404), ``UnauthenticatedError``
    (401), ``PermissionDeniedError`` (403) or ``HarnessInstallError`` (anything else,
    including a body over ``max_bytes``)."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        # urllib would also open file:, ftp: and data: URLs: a manifest or a typo must
        # not turn an update into a read of local files.
        raise HarnessInstallError(f"cannot fetch {url}: only http and https URLs are fetched")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (http or https, checked above)
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:  # noqa: S310 (http or https, checked above)
            data = response.read(max_bytes + 1)
            if len(data) > max_bytes:
                raise HarnessInstallError(f"{url} sent more than {max_bytes} bytes")
            return Fetched(data, response.headers.get("x-reef-release-id"), _etag(response.headers))
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode("utf-8", "replace")
        message = f"GET {url} answered {exc.code}: {detail}"
        if exc.code == 404:
            raise HarnessUnavailableError(message) from exc
        if exc.code == 401:
            raise UnauthenticatedError(message) from exc
        if exc.code == 403:
            raise PermissionDeniedError(message) from exc
        raise HarnessInstallError(message) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HarnessInstallError(f"cannot fetch {url}: {reason}") from exc


def fetch_manifest(
    url: str, scenario: str, api_key: str | None, timeout_seconds: float
) -> HarnessManifest:
    """The scenario's harness manifest, checked against its headers."""
    target = scenario_url(url, scenario, "harness")
    fetched = fetch(target, api_key, MANIFEST_MAX_BYTES, timeout_seconds)
    try:
        manifest = HarnessManifest.model_validate_json(fetched.data)
    except ValidationError as exc:
        raise HarnessInstallError(f"{target} sent an invalid manifest: {exc}") from exc
    check_headers(target, fetched, manifest)
    return manifest


def check_headers(target: str, fetched: Fetched, manifest: HarnessManifest) -> None:
    """Raise ``HarnessInstallError`` when the response headers name another release or
    digest than ``manifest`` (the head moved between two requests)."""
    if fetched.release_id is not None and fetched.release_id != manifest.release_id:
        raise HarnessInstallError(
            f"{target} is release {fetched.release_id!r}, the manifest said "
            f"{manifest.release_id!r} (the head moved; install again)"
        )
    if fetched.etag is not None and fetched.etag != manifest.digest:
        raise HarnessInstallError(
            f"{target} has ETag {fetched.etag!r}, the manifest said {manifest.digest!r} "
            "(the head moved; install again)"
        )

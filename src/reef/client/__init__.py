"""The client-side Python API, for agents that run their own loop.

Owns: installing a scenario's harness from a Reef gateway onto the agent's machine
(fetch the manifest and bundle, verify the digest, unpack into
``dir/releases/<release_id>/``, atomically repoint ``dir/current``), rolling back to an
installed release, loading the current harness, and rendering messages with it.
Does not own: the bundle format, digest and rendering rules (``harness``), the HTTP
routes that serve bundles (``gateway``), the release chain (``releases``). Must not
import gateway, learning or torch; uses only the standard library for HTTP.
Extend: new client-side helpers are functions here over ``reef.harness`` values; keep
this package importable without the server's dependencies beyond pydantic and PyYAML.
"""

from reef.client.download import HarnessManifest
from reef.client.errors import (
    HarnessDigestMismatchError,
    HarnessInstallError,
    HarnessUnavailableError,
    ReleaseNotInstalledError,
)
from reef.client.installing import (
    InstalledHarness,
    InstallRecord,
    current_release,
    install_harness,
    installed_release,
    load_installed,
    rollback_installed,
)
from reef.client.messages import render_messages

__all__ = [
    "HarnessDigestMismatchError",
    "HarnessInstallError",
    "HarnessManifest",
    "HarnessUnavailableError",
    "InstallRecord",
    "InstalledHarness",
    "ReleaseNotInstalledError",
    "current_release",
    "install_harness",
    "installed_release",
    "load_installed",
    "render_messages",
    "rollback_installed",
]

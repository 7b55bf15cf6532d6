"""The client package's errors, each a ``reef.core`` category."""

from __future__ import annotations

from reef.core.errors import NotFoundError, ReefError


class HarnessInstallError(ReefError):
    """Installing a harness failed (unreachable server, bad response, moved head);
    ``current`` was not touched."""


class HarnessDigestMismatchError(HarnessInstallError):
    """A bundle's digest differs from the one it was announced or installed with; it
    was refused and ``current`` was not touched."""


class HarnessUnavailableError(NotFoundError):
    """The server has no harness for that scenario (HTTP 404)."""


class ReleaseNotInstalledError(NotFoundError):
    """The install directory has no such release, or no ``current`` release."""

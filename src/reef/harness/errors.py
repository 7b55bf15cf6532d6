"""The harness package's errors, each a ``reef.core`` category."""

from __future__ import annotations

from reef.core.errors import InvalidInputError


class InvalidHarnessError(InvalidInputError):
    """``harness.yaml`` does not parse or does not follow the schema; the message names
    the field."""


class UnsafeBundleError(InvalidInputError):
    """A bundle (archive or directory) holds something that must not be unpacked or
    stored: an absolute or ``..`` path, a link, a device, a duplicate, or too much data.
    The message names the entry. Also raised for an archive that is not valid .tar.gz."""

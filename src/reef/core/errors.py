"""The error root and the generic categories every package refines.

The gateway maps categories to HTTP status codes in one place and the CLI maps them to
exit codes in one place, so a package only has to pick the right category.
"""

from __future__ import annotations


class ReefError(Exception):
    """Root of every error Reef raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInputError(ReefError):
    """The caller sent something malformed; the message says what to fix."""


class NotFoundError(ReefError):
    """A named thing (record, scenario, release, ...) does not exist."""


class ConflictError(ReefError):
    """The request conflicts with what is stored (idempotency key reuse, moved head)."""


class UnauthenticatedError(ReefError):
    """No credentials, or credentials that match no key."""


class PermissionDeniedError(ReefError):
    """Valid credentials that are not allowed to do this."""

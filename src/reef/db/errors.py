"""The one error of the database part: it cannot be reached or written."""

from __future__ import annotations

from reef.core.errors import ReefError


class StoreUnavailableError(ReefError):
    """The database cannot be reached or written (locked, disk full, connection lost)."""

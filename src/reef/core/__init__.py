"""Core values shared by every package: ids, the error root, JSON and hashing.

Owns: UUIDv7 ids, ``ReefError`` and its generic categories, canonical JSON and digests.
Does not own: anything that knows about HTTP, SQL, models or configuration; ``core``
imports nothing else from ``reef``.
Extend: packages subclass the error categories here for their own failures.
"""

from reef.core.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    ReefError,
    UnauthenticatedError,
)
from reef.core.ids import new_id
from reef.core.jsoncodec import canonical_json, dumps, loads, sha256_hex

__all__ = [
    "ConflictError",
    "InvalidInputError",
    "NotFoundError",
    "PermissionDeniedError",
    "ReefError",
    "UnauthenticatedError",
    "canonical_json",
    "dumps",
    "loads",
    "new_id",
    "sha256_hex",
]

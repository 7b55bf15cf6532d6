"""Core values shared by every package: ids, the error root, JSON and hashing, trust levels.

Owns: UUIDv7 ids, ``ReefError`` and its generic categories, canonical JSON and digests,
the ``Clock`` that time-dependent parts read (``utc_now`` unless a test injects one),
``Progress``, where long tasks report how far they got, the one retry helper
(``retrying``: ``RetryPolicy``, ``Retrier``, ``parse_retry_after``), ``PluginRegistry``
(``plugins``: learners, scorers and environments found by entry point) and the checks
of a checkpoint directory (``checkpoints``), and the chat and tool-call format a
conversation is written down in for a model (``chat_format``: the engine serves it, the
learners train on it).
Does not own: anything that knows about HTTP, SQL, loading or running models, or
configuration; ``core`` imports nothing else from ``reef``.
Extend: packages subclass the error categories here for their own failures.
"""

from reef.core.clock import Clock, read_clock, utc_now
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
from reef.core.progress import Progress, SilentProgress
from reef.core.retrying import Retrier, RetryPolicy, parse_retry_after
from reef.core.trust import TRUST_LEVELS, Trust, at_least, parse_trust, trust_rank

__all__ = [
    "TRUST_LEVELS",
    "Clock",
    "ConflictError",
    "InvalidInputError",
    "NotFoundError",
    "PermissionDeniedError",
    "Progress",
    "ReefError",
    "Retrier",
    "RetryPolicy",
    "SilentProgress",
    "Trust",
    "UnauthenticatedError",
    "at_least",
    "canonical_json",
    "dumps",
    "loads",
    "new_id",
    "parse_retry_after",
    "parse_trust",
    "read_clock",
    "sha256_hex",
    "trust_rank",
    "utc_now",
]

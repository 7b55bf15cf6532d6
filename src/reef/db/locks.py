"""PostgreSQL transaction-level advisory locks, keyed the same in every process."""

from __future__ import annotations

from sqlalchemy import text

from reef.core import sha256_hex


def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for ``parts`` (same in every process)."""
    digest = sha256_hex("\x00".join(parts).encode())
    return int.from_bytes(bytes.fromhex(digest[:16]), "big", signed=True)


# Sorted keys, so two writers never wait on each other in a cycle; unnest keeps the order.
PG_ADVISORY_LOCKS = text("SELECT pg_advisory_xact_lock(k) FROM unnest(CAST(:keys AS bigint[])) k")

"""The errors of the database part: it cannot be reached or written, or its schema
cannot be brought to this Reef's revision."""

from __future__ import annotations

from pathlib import Path

from reef.core.errors import ReefError


class StoreUnavailableError(ReefError):
    """The database cannot be reached or written (locked, disk full, connection lost)."""


class StoreNewerThanReefError(ReefError):
    """The store's schema revision is one this Reef does not know: a later Reef wrote it.
    Nothing was written to the store."""

    def __init__(self, store_revision: str, newest_known: str) -> None:
        super().__init__(
            f"the store is at schema revision {store_revision}, newer than this Reef knows "
            f"(its newest is {newest_known}): a later Reef wrote it. Run that Reef or a newer "
            "one; this one changed nothing in the store"
        )
        self.store_revision = store_revision
        self.newest_known = newest_known


class MigrationFailedError(ReefError):
    """A schema revision failed to apply; its transaction rolled back, so the store is
    still at the revision it had. Names the revision, the statement, the backup (SQLite)
    and how to retry."""

    def __init__(
        self,
        revision: str,
        reason: str,
        statement: str | None,
        store: str,
        backup: Path | None,
    ) -> None:
        self.revision = revision
        self.statement = statement
        self.backup = backup
        self.store = store
        parts = [f"schema migration {revision} failed: {reason}"]
        if statement:
            parts.append(f"failing statement: {' '.join(statement.split())}")
        parts.append(f"the transaction rolled back: {store} is unchanged")
        if backup is not None:
            parts.append(
                f"a copy taken before the upgrade is at {backup}. To retry: fix the cause, "
                "then run `reef migrate` (or start Reef) again. To go back instead: stop "
                f"Reef, copy {backup} over {store}, start the earlier Reef"
            )
        else:
            parts.append(
                "take a pg_dump of the database before you retry (docs/operations.md, "
                "Upgrading); fix the cause, then run `reef migrate` (or start Reef) again"
            )
        super().__init__("; ".join(parts))


class BackupFailedError(MigrationFailedError):
    """The copy of a SQLite store that comes before an upgrade could not be written
    (a full disk, a directory Reef may not write); nothing was migrated."""

    def __init__(self, revision: str, reason: str, store: str, backup: Path) -> None:
        ReefError.__init__(
            self,
            f"could not copy {store} to {backup} before upgrading it from schema revision "
            f"{revision}: {reason}; nothing was changed. Free space or make the directory "
            "writable, then start Reef (or run `reef migrate`) again",
        )
        self.revision = revision
        self.statement = None
        self.backup = None
        self.store = store

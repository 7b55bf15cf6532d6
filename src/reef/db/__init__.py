"""The database: one SQLAlchemy engine for SQLite or PostgreSQL, one schema, its migrations.

Owns: ``Database`` (the engine, its dialect, read and write transactions, ``migrate``),
store URLs and SQLite tuning (``engine``), the SQL schema of every table of DESIGN.md §3
(``schema``), the Alembic migrations that create it (``migrations``), advisory lock keys
(``locks``), the copy of a SQLite store taken before an upgrade (``backup``) and its
errors (``errors``).
Does not own: what any row means. The stores that sit on it side by side — experience,
releases, evaluation results, jobs — own their rules and their queries; the composition
root builds one ``Database`` and hands it to each. Must not import any other reef part
but ``core``.
Extend: a schema change is a new revision in ``migrations/versions`` (copy the newest
one's header, set ``down_revision``) plus the same change in ``schema.py``; a test
compares the migrated database with ``schema.metadata``, and the upgrade test fails until
``tests/db/revision_fixtures.py`` has the revision's entry (the tables it creates, the
columns it adds and what older rows get in them).
"""

from reef.db.database import Database, open_database
from reef.db.engine import DEFAULT_BUSY_TIMEOUT_MS, unavailable_on_failure
from reef.db.errors import (
    BackupFailedError,
    MigrationFailedError,
    StoreNewerThanReefError,
    StoreUnavailableError,
)
from reef.db.locks import lock_key
from reef.db.migrations import head_revision, known_revisions

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_MS",
    "BackupFailedError",
    "Database",
    "MigrationFailedError",
    "StoreNewerThanReefError",
    "StoreUnavailableError",
    "head_revision",
    "known_revisions",
    "lock_key",
    "open_database",
    "unavailable_on_failure",
]

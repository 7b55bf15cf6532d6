"""Alembic migrations of the one schema (``reef.db.schema``), run from code.

Users never need an ``alembic.ini``: ``upgrade(engine)`` builds the Alembic config here,
pointing ``script_location`` at this package, and runs every pending revision inside one
transaction that also serialises concurrent starters (``BEGIN IMMEDIATE`` on SQLite, a
transaction-level advisory lock on PostgreSQL). The second process to start waits, then
finds the schema at head and does nothing.

Under that lock, before anything is written: a store whose revision this Reef does not
know (a later Reef wrote it) is refused (``StoreNewerThanReefError``); a SQLite store
that is behind head and not new is copied beside itself (``reef.db.backup``). On SQLite
the revisions run by SQLite's procedure for schema changes that rebuild a table (batch
mode copies, drops and renames it): foreign keys are turned off on the connection
before the transaction begins (the pragma does nothing inside one), ``PRAGMA
foreign_key_check`` runs after each revision and any violation rolls everything back,
and foreign keys are turned on again once the transaction has ended. A failed revision
raises ``MigrationFailedError`` naming it, its statement and the backup.

Extend: add ``versions/NNNN_<what>.py`` (copy the header of the newest one, set
``down_revision``) and the matching change to ``reef.db.schema``; the schema test
fails until both agree, and the upgrade test fails until
``tests/db/revision_fixtures.py`` fills a store at the new revision with rows.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import exc, text
from sqlalchemy.engine import Connection, Engine

from reef.db.backup import backup_path, backup_sqlite_store
from reef.db.errors import BackupFailedError, MigrationFailedError, StoreNewerThanReefError

log = logging.getLogger(__name__)

VERSION_TABLE = "reef_alembic_version"
SQLITE_BEGIN_OPTION = "reef_sqlite_begin"

# Any constant works; it only has to be the same in every Reef process.
_PG_MIGRATION_LOCK = 0x52454546_0001  # "REEF" + 1
_SHOWN_VIOLATIONS = 5


def alembic_config() -> Config:
    """An Alembic ``Config`` for this package's scripts (no ini file)."""
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    return config


def script_directory() -> ScriptDirectory:
    """This Reef's migration scripts."""
    return ScriptDirectory.from_config(alembic_config())


def known_revisions() -> list[str]:
    """Every revision this Reef has, oldest first."""
    return [script.revision for script in reversed(list(script_directory().walk_revisions()))]


def head_revision() -> str:
    """The newest revision this Reef has."""
    head = script_directory().get_current_head()
    assert head is not None
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the database behind ``connection`` is at; ``None`` before any."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def plan(current: str | None, target: str = "head") -> list[str]:
    """The revisions that take a store at ``current`` to ``target``, oldest first.
    Raises ``StoreNewerThanReefError`` when ``current`` is not one of this Reef's."""
    script = script_directory()
    if current is not None:
        try:
            script.get_revision(current)
        except CommandError:
            raise StoreNewerThanReefError(current, head_revision()) from None
    steps = script.iterate_revisions(target, current or "base")
    return [step.revision for step in reversed(list(steps)) if step is not None]


def pending_revisions(engine: Engine, target: str = "head") -> list[str]:
    """What ``upgrade(engine, target)`` would apply now, oldest first; reads only.
    Raises ``StoreNewerThanReefError`` like ``upgrade``."""
    with engine.connect() as connection, connection.begin():
        return plan(current_revision(connection), target)


def upgrade(engine: Engine, revision: str = "head") -> list[str]:
    """Bring the database behind ``engine`` to ``revision``; safe to run concurrently.
    Returns the revisions applied (none when it was there already).

    Raises ``StoreNewerThanReefError`` (nothing written) and ``MigrationFailedError``
    (rolled back: the store is as it was; a SQLite store was copied first)."""
    config = alembic_config()
    with engine.connect() as connection, _foreign_keys_off(connection):
        # The SQLite begin hook (see reef.db.engine) turns this option into
        # BEGIN IMMEDIATE, taking the write lock before Alembic reads the version.
        connection = connection.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        with connection.begin():
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK}
                )
            current = current_revision(connection)
            steps = plan(current, revision)
            if not steps:
                return []
            backup = _backup(connection, current)
            run = _Run(connection, steps, backup)
            config.attributes["connection"] = connection
            config.attributes["on_version_apply"] = run.applied
            try:
                command.upgrade(config, revision)
            except exc.DBAPIError as error:
                raise run.failure(str(error.orig), error.statement) from error
    log.info("upgraded the store's schema through %s", ", ".join(steps))
    return steps


def store_label(connection: Connection) -> str:
    """The store as a person names it: the SQLite file, or the PostgreSQL URL without
    its password."""
    url = connection.engine.url
    if url.get_backend_name() == "sqlite" and url.database:
        return str(Path(url.database).expanduser().absolute())
    return url.render_as_string(hide_password=True)


def _backup(connection: Connection, current: str | None) -> Path | None:
    """A copy of a SQLite store that already has a schema, before it is upgraded."""
    if connection.dialect.name != "sqlite" or current is None:
        return None  # PostgreSQL: the operator's pg_dump; a new store: nothing to keep
    store = Path(store_label(connection))
    try:
        return backup_sqlite_store(store, current)
    except (sqlite3.Error, OSError) as error:
        raise BackupFailedError(
            current, str(error), str(store), backup_path(store, current)
        ) from error


@contextmanager
def _foreign_keys_off(connection: Connection) -> Iterator[None]:
    """SQLite: foreign keys off on this connection while the migration runs (a batch
    rebuild drops a table other rows still reference), on again afterwards. Set on the
    driver's connection so SQLAlchemy does not begin a transaction around the pragma."""
    if connection.dialect.name != "sqlite":
        yield
        return
    driver = connection.connection.driver_connection
    assert driver is not None
    driver.execute("PRAGMA foreign_keys = OFF")
    try:
        yield
    finally:
        try:
            driver.execute("PRAGMA foreign_keys = ON")
        except Exception:  # never hand the pool a connection without foreign keys
            connection.invalidate()


class _Run:
    """One upgrade in progress: which revisions are done, and what a failure names."""

    def __init__(self, connection: Connection, steps: list[str], backup: Path | None) -> None:
        self.connection = connection
        self.steps = steps
        self.backup = backup
        self.done = 0

    def applied(self, *, step: Any, **_: Any) -> None:
        """Alembic's ``on_version_apply``: a revision ran. On SQLite its rows must still
        satisfy every foreign key (the check that foreign keys off skipped)."""
        self.done += 1
        if self.connection.dialect.name != "sqlite":
            return
        statement = "PRAGMA foreign_key_check"
        violations = self.connection.exec_driver_sql(statement).all()
        if violations:
            raise self.error(str(step.up_revision_id), _describe(violations), statement)

    def failure(self, reason: str, statement: str | None) -> MigrationFailedError:
        """The error for a statement that failed: in the revision after those done."""
        return self.error(self.steps[min(self.done, len(self.steps) - 1)], reason, statement)

    def error(self, revision: str, reason: str, statement: str | None) -> MigrationFailedError:
        """The error naming ``revision``, the statement, the store and its backup."""
        store = store_label(self.connection)
        return MigrationFailedError(revision, reason, statement, store, self.backup)


def _describe(violations: Sequence[Any]) -> str:
    """``PRAGMA foreign_key_check`` rows (table, rowid, parent, fk index) in words."""
    shown = [f"{row[0]} rowid {row[1]} (no row in {row[2]})" for row in violations]
    listed = ", ".join(shown[:_SHOWN_VIOLATIONS])
    more = len(shown) - _SHOWN_VIOLATIONS
    return f"{len(shown)} row(s) break a foreign key: {listed}" + (
        f" and {more} more" if more > 0 else ""
    )

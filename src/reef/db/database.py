"""``Database``: the one engine every store sits on, its dialect, and its migrations."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager

from sqlalchemy import inspect
from sqlalchemy.engine import Connection, Engine

from reef.db.engine import (
    DEFAULT_BUSY_TIMEOUT_MS,
    create_store_engine,
    read_transaction,
    unavailable_on_failure,
    write_transaction,
)
from reef.db.locks import PG_ADVISORY_LOCKS
from reef.db.migrations import VERSION_TABLE, pending_revisions, upgrade


class Database:
    """A SQLite file or a PostgreSQL database, reached through one SQLAlchemy engine.

    A composition root (``reef serve``, a CLI command, a test) builds one and hands it to
    every store (experience, releases, evaluations, jobs); stores never dispose it, its
    builder calls ``close()`` once they are done. Database failures raise
    ``StoreUnavailableError``.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name

    @classmethod
    def open(cls, url: str, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Database:
        """The database behind ``url`` (``sqlite:///path`` or ``postgresql://…``), not yet
        migrated. Raises ``InvalidInputError`` for other URLs and ``MissingExtraError``
        for PostgreSQL without psycopg."""
        return cls(create_store_engine(url, busy_timeout_ms))

    @property
    def url(self) -> str:
        """The URL this database was opened with, password included."""
        return self.engine.url.render_as_string(hide_password=False)

    def migrate(self) -> list[str]:
        """Bring the schema to the newest revision; safe when several processes start
        together (the second waits, then finds nothing to do). Returns the revisions
        applied. A SQLite store is copied beside itself first (``reef.db.before-<rev>``).
        Raises ``StoreNewerThanReefError`` for a store a later Reef wrote (nothing
        written) and ``MigrationFailedError`` when a revision fails (rolled back)."""
        with unavailable_on_failure():
            return upgrade(self.engine)

    def pending_revisions(self) -> list[str]:
        """The revisions ``migrate`` would apply now, oldest first; changes nothing.
        Raises ``StoreNewerThanReefError`` like ``migrate``."""
        with unavailable_on_failure():
            return pending_revisions(self.engine)

    def has_schema(self) -> bool:
        """Whether Reef's migrations have ever run here."""
        with unavailable_on_failure(), self.engine.connect() as connection:
            return bool(inspect(connection).has_table(VERSION_TABLE))

    def read(self) -> AbstractContextManager[Connection]:
        """A connection in a read transaction."""
        return read_transaction(self.engine)

    @contextmanager
    def write(self, lock_keys: Iterable[int] = ()) -> Iterator[Connection]:
        """A connection in a write transaction that first takes its locks: SQLite's write
        lock (``BEGIN IMMEDIATE``), or on PostgreSQL the advisory locks ``lock_keys``
        (from ``lock_key``), taken in sorted order so writers never deadlock."""
        with write_transaction(self.engine) as conn:
            self.lock(conn, lock_keys)
            yield conn

    def lock(self, conn: Connection, lock_keys: Iterable[int]) -> None:
        """Take the advisory locks ``lock_keys`` in ``conn``'s transaction, until it ends
        (PostgreSQL; on SQLite a write transaction already excludes every other writer)."""
        keys = sorted(set(lock_keys))
        if keys and self.dialect == "postgresql":
            conn.execute(PG_ADVISORY_LOCKS, {"keys": keys})

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()


def open_database(
    url: str, migrate: bool = True, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
) -> Database:
    """``Database.open(url, busy_timeout_ms)``, migrated unless ``migrate`` is false;
    nothing is left open when opening or migrating fails."""
    database = Database.open(url, busy_timeout_ms)
    if migrate:
        try:
            database.migrate()
        except BaseException:
            database.close()
            raise
    return database

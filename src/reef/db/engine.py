"""SQLAlchemy engines: URL translation, SQLite tuning, and the transactions stores run in."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, exc
from sqlalchemy.engine import URL, Connection, Engine, make_url

from reef.core.errors import InvalidInputError, optional_dependency
from reef.db.errors import StoreUnavailableError
from reef.db.migrations import SQLITE_BEGIN_OPTION

log = logging.getLogger(__name__)

DEFAULT_BUSY_TIMEOUT_MS = 10_000


def store_url(url: str) -> URL:
    """Parse a store URL and pick our drivers: pysqlite, and psycopg 3 for PostgreSQL.

    Raises ``InvalidInputError`` for other backends and for in-memory SQLite (every
    pooled connection would see its own empty database).
    """
    try:
        parsed = make_url(url)
    except exc.ArgumentError as error:
        raise InvalidInputError(f"not a store URL: {url!r}") from error
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise InvalidInputError("the SQLite store needs a file path: sqlite:///path/reef.db")
        return parsed.set(drivername="sqlite+pysqlite")
    if backend == "postgresql":
        return parsed.set(drivername="postgresql+psycopg")
    raise InvalidInputError(
        f"unsupported store URL scheme {parsed.drivername!r}; use sqlite:/// or postgresql://"
    )


def create_store_engine(url: str, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Engine:
    """An engine for ``url``; creates the parent directory of a SQLite file. Raises
    ``MissingExtraError`` for PostgreSQL without psycopg (the ``postgres`` extra)."""
    parsed = store_url(url)
    if parsed.get_backend_name() == "postgresql":
        with optional_dependency("postgres", "a PostgreSQL store"):  # imports psycopg
            return create_engine(parsed, pool_pre_ping=True, pool_size=8, max_overflow=32)
    assert parsed.database is not None
    Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        parsed,
        connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
        pool_size=8,
        max_overflow=32,
    )
    _tune_sqlite(engine, busy_timeout_ms)
    return engine


def _tune_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own transaction handling skips BEGIN before SELECT and DDL; we emit
        # BEGIN ourselves (below) so reads are snapshots and DDL is transactional.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            _switch_to_wal(cursor, busy_timeout_ms)
            # NORMAL is durable across application crashes in WAL mode; only an OS crash
            # or power loss can drop the last commits.
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # Writers take the write lock up front: a deferred transaction that reads and
        # then writes can fail with SQLITE_BUSY instead of waiting for busy_timeout.
        mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if mode == "IMMEDIATE" else "BEGIN")


def _switch_to_wal(cursor: Any, busy_timeout_ms: int) -> None:
    """Put the database in WAL mode (a persistent setting of the file).

    The switch needs an exclusive lock and SQLite answers "database is locked" at once,
    without its busy handler, when another connection is using a fresh database — as when
    several processes start on a new file together. So: retry until busy_timeout.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    delay = 0.005
    while True:
        try:
            mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError:
            if time.monotonic() + delay > deadline:
                raise
            mode = None
        if mode == "wal":
            return
        if mode is not None and time.monotonic() + delay > deadline:
            # e.g. a filesystem without shared memory: run on in the mode SQLite kept.
            log.warning("SQLite refused WAL mode; running in %s journal mode", mode)
            return
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


@contextmanager
def unavailable_on_failure() -> Iterator[None]:
    """Turn "cannot reach or lock the database" into ``StoreUnavailableError``."""
    try:
        yield
    except (exc.OperationalError, exc.InterfaceError) as error:
        raise StoreUnavailableError(f"experience store unavailable: {error.orig}") from error
    except exc.DBAPIError as error:
        if error.connection_invalidated:
            raise StoreUnavailableError(
                f"experience store connection lost: {error.orig}"
            ) from error
        raise


@contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """A connection in a read transaction; outages raise ``StoreUnavailableError``."""
    with unavailable_on_failure(), engine.connect() as conn, conn.begin():
        yield conn


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A connection in a write transaction, begun ``IMMEDIATE`` on SQLite (writers take
    the lock up front, so they queue instead of failing to upgrade a read lock)."""
    with unavailable_on_failure(), engine.connect() as conn:
        conn = conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        with conn.begin():
            yield conn

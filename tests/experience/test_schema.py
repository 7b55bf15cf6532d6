"""The migrations create exactly ``reef.db.schema``, idempotently and concurrently."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from reef.core.errors import InvalidInputError
from reef.db.migrations import VERSION_TABLE, alembic_config
from reef.db.schema import metadata
from reef.experience import SQLExperienceStore, StoreUnavailableError, open_store
from tests.experience.conftest import ThrowawayDatabases


def _context(conn: Connection) -> MigrationContext:
    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})


TABLES = {
    "scenarios",
    "records",
    "feedback",
    "feedback_refs",
    "artifacts",
    "candidates",
    "releases",
    "heads",
    "jobs",
    "consumed",
    "evaluations",
    "eval_results",
    "eval_items",
    "eval_episodes",
    "responses",
    "spend_windows",
    "idempotency_claims",
}


def test_migrated_database_matches_the_schema_module(store: SQLExperienceStore) -> None:
    with store.database.engine.connect() as conn:
        names = set(inspect(conn).get_table_names())
        diff = compare_metadata(_context(conn), metadata)
    assert names == TABLES | {VERSION_TABLE}
    assert diff == []


def test_migrate_twice_changes_nothing(store: SQLExperienceStore) -> None:
    store.migrate()
    store.migrate()
    with store.database.engine.connect() as conn:
        assert _context(conn).get_current_heads() == tuple(
            ScriptDirectory.from_config(alembic_config()).get_heads()
        )


def _migrate_concurrently(url: str, starters: int = 4) -> list[BaseException]:
    stores = [SQLExperienceStore.from_url(url) for _ in range(starters)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(starters)

    def start(store: SQLExperienceStore) -> None:
        barrier.wait()
        try:
            store.migrate()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=start, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in stores:
        store.close()
    return errors


def test_concurrent_first_migrations_on_sqlite_all_succeed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert _migrate_concurrently(url) == []
    store = SQLExperienceStore.from_url(url)
    with store.database.engine.connect() as conn:
        assert compare_metadata(_context(conn), metadata) == []
    store.close()


@pytest.mark.postgres
def test_concurrent_first_migrations_on_postgresql_all_succeed(
    pg_databases: ThrowawayDatabases,
) -> None:
    url = pg_databases.create()
    assert _migrate_concurrently(url) == []
    store = SQLExperienceStore.from_url(url)
    with store.database.engine.connect() as conn:
        assert compare_metadata(_context(conn), metadata) == []
    store.close()


def test_open_store_creates_parent_directories_and_migrates(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "reef.db"
    store = open_store(f"sqlite:///{path}")
    store.ping()
    store.close()
    assert path.exists()


@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite://", "sqlite:///:memory:", "not a url"])
def test_unsupported_urls_are_rejected(url: str) -> None:
    with pytest.raises(InvalidInputError):
        SQLExperienceStore.from_url(url)


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    store = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'r.db'}")
    with store.database.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    store.close()


def test_unreachable_database_is_store_unavailable() -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    store = SQLExperienceStore.from_url("postgresql://postgres@127.0.0.1:1/none")
    with pytest.raises(StoreUnavailableError):
        store.ping()
    with pytest.raises(StoreUnavailableError):
        store.migrate()
    store.close()

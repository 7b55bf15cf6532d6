"""Fixtures: a migrated store on SQLite (fresh file per test) and on PostgreSQL.

PostgreSQL runs when REEF_TEST_POSTGRES_URL names a server we may create databases on;
one throwaway database serves the session and is emptied before each test.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from reef.core import new_id
from reef.db.schema import metadata
from reef.experience import RecordDraft, SQLExperienceStore

PG_ENV = "REEF_TEST_POSTGRES_URL"

DraftFactory = Callable[..., RecordDraft]


class ThrowawayDatabases:
    """Creates PostgreSQL databases next to the one in REEF_TEST_POSTGRES_URL; drops them."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = make_url(admin_url).set(drivername="postgresql+psycopg")
        self.engine = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        self.names: list[str] = []

    def create(self) -> str:
        name = f"reef_test_{secrets.token_hex(6)}"
        with self.engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        self.names.append(name)
        return self.admin_url.set(database=name).render_as_string(hide_password=False)

    def drop_all(self) -> None:
        with self.engine.connect() as conn:
            for name in self.names:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self.engine.dispose()


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[ThrowawayDatabases]:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is not set; PostgreSQL store tests need a server")
    databases = ThrowawayDatabases(url)
    yield databases
    databases.drop_all()


@pytest.fixture(scope="session")
def pg_url(pg_databases: ThrowawayDatabases) -> str:
    url = pg_databases.create()
    store = SQLExperienceStore.from_url(url)
    store.migrate()
    store.close()
    return url


@pytest.fixture(
    params=[pytest.param("sqlite"), pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty, migrated store on each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'nested' / 'reef.db'}"
        store = SQLExperienceStore.from_url(url)
        store.migrate()
        store.close()
        return url
    pg_url: str = request.getfixturevalue("pg_url")
    engine = create_engine(make_url(pg_url).set(drivername="postgresql+psycopg"))
    with engine.begin() as conn:
        # DELETE beats TRUNCATE on tables this small (TRUNCATE swaps files).
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()
    return pg_url


@pytest.fixture
def store(store_url: str) -> Iterator[SQLExperienceStore]:
    store = SQLExperienceStore.from_url(store_url)
    yield store
    store.close()


@pytest.fixture
def make_draft() -> DraftFactory:
    """Builds a valid ``RecordDraft``; keyword arguments override any field."""

    def build(**overrides: Any) -> RecordDraft:
        fields: dict[str, Any] = {
            "id": new_id(),
            "scenario": "support",
            "session_id": "session-1",
            "api": "openai.chat",
            "request": {"model": "m", "messages": [{"role": "user", "content": "hello"}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "hi"}}]},
            "status": "ok",
            "error": None,
            "latency_ms": 12.5,
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            "release_id": None,
            "prompt_hash": "sha256:" + "a" * 64,
            "content_hash": "sha256:" + "b" * 64,
            "continuation_hash": None,
        }
        fields.update(overrides)
        return RecordDraft(**fields)

    return build


@contextmanager
def hold_write_lock(url: str) -> Iterator[None]:
    """Block every record insert into the store at ``url`` until the block exits.

    SQLite: another connection holds the database write lock. PostgreSQL: another
    transaction holds an EXCLUSIVE lock on ``records`` (reads still pass).
    """
    if url.startswith("sqlite"):
        path = make_url(url).database
        assert path is not None
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
    with engine.connect() as pg_conn:
        pg_conn.execute(text("LOCK TABLE records IN EXCLUSIVE MODE"))
        try:
            yield
        finally:
            pg_conn.rollback()
    engine.dispose()

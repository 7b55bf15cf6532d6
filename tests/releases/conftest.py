"""Fixtures: a migrated store on SQLite (fresh file per test) and on PostgreSQL, and a
``ReleaseChain`` on it.

PostgreSQL runs when REEF_TEST_POSTGRES_URL names a server we may create databases on
(the throwaway-database approach of tests/experience): one database serves the session
and is emptied before each test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from reef.db.schema import metadata
from reef.experience import SQLExperienceStore
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest
from tests.experience.conftest import PG_ENV, ThrowawayDatabases

ManifestFactory = Callable[..., ReleaseManifest]


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[ThrowawayDatabases]:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is not set; PostgreSQL release-chain tests need a server")
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


def _empty(url: str) -> None:
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()


@pytest.fixture(
    params=[pytest.param("sqlite"), pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty, migrated store on each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'reef.db'}"
        store = SQLExperienceStore.from_url(url)
        store.migrate()
        store.close()
        return url
    url = str(request.getfixturevalue("pg_url"))
    _empty(url)
    return url


@pytest.fixture
def chain(store_url: str) -> Iterator[ReleaseChain]:
    """A chain on the experience store's engine, as the gateway and worker build it."""
    store = SQLExperienceStore.from_url(store_url)
    yield ReleaseChain(store.database)
    store.close()


def digest(n: int) -> str:
    """A well-formed artifact digest, distinct for each ``n``."""
    return "sha256:" + f"{n:064x}"


@pytest.fixture
def manifest() -> ManifestFactory:
    """Builds a manifest; ``adapter``/``harness`` take an int (made a digest) or None."""

    def build(adapter: int | None = None, harness: int | None = None) -> ReleaseManifest:
        return ReleaseManifest(
            model=ModelComponent(
                base="tiny-llama", adapter=None if adapter is None else digest(adapter)
            ),
            harness=None if harness is None else digest(harness),
            recipe="test-recipe",
        )

    return build


@pytest.fixture
def pg_chain(pg_url: str) -> Iterator[ReleaseChain]:
    """A chain on the emptied PostgreSQL test database (for PostgreSQL-only tests)."""
    _empty(pg_url)
    chain = ReleaseChain.from_url(pg_url, migrate=False)
    yield chain
    chain.close()

"""Fixtures: the populated gateway (built once for the dashboard tests), and a migrated
store on SQLite and on PostgreSQL for the learning-curve query.

PostgreSQL runs when REEF_TEST_POSTGRES_URL names a server we may create databases on
(the throwaway-database approach of tests/experience).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from reef.experience import SQLExperienceStore
from reef.experience.schema import metadata
from tests.dashboard.world import DashboardWorld, dashboard_world
from tests.experience.conftest import PG_ENV, ThrowawayDatabases


@pytest.fixture(scope="package")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardWorld]:
    with dashboard_world(tmp_path_factory.mktemp("dashboard")) as built:
        yield built


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[ThrowawayDatabases]:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is not set; PostgreSQL dashboard tests need a server")
    databases = ThrowawayDatabases(url)
    yield databases
    databases.drop_all()


@pytest.fixture(scope="session")
def pg_url(pg_databases: ThrowawayDatabases) -> str:
    url = pg_databases.create()
    store = SQLExperienceStore(url)
    store.migrate()
    store.close()
    return url


@pytest.fixture(
    params=[pytest.param("sqlite"), pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLExperienceStore]:
    """An empty, migrated store on each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'reef.db'}"
    else:
        url = str(request.getfixturevalue("pg_url"))
        engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
        with engine.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())
        engine.dispose()
    opened = SQLExperienceStore(url)
    opened.migrate()
    yield opened
    opened.close()

"""Fixtures: the populated gateway (built once for the dashboard tests), and a migrated
store on SQLite and on PostgreSQL for the learning-curve query.

PostgreSQL runs when REEF_TEST_POSTGRES_URL names a server we may create databases on
(the throwaway-database approach of tests/experience).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from reef.experience import SQLExperienceStore
from reef.experience.schema import metadata
from tests.dashboard.world import DashboardWorld, dashboard_world
from tests.experience.conftest import pg_databases, pg_url  # noqa: F401 - fixtures


@pytest.fixture(scope="package")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardWorld]:
    with dashboard_world(tmp_path_factory.mktemp("dashboard")) as built:
        yield built


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

"""Fixtures: the populated gateway (built once for the dashboard tests), headless Chromium
and a tab on that gateway's dashboard, and a migrated store on SQLite and on PostgreSQL
for the learning-curve query.

PostgreSQL runs when REEF_TEST_POSTGRES_URL names a server we may create databases on
(the throwaway-database approach of tests/experience).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from reef.db.schema import metadata
from reef.experience import SQLExperienceStore
from tests.dashboard.browser import DashboardPage, chromium_path
from tests.dashboard.world import DashboardWorld, dashboard_world
from tests.experience.conftest import pg_databases, pg_url  # noqa: F401 - fixtures


@pytest.fixture(scope="package")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardWorld]:
    with dashboard_world(tmp_path_factory.mktemp("dashboard")) as built:
        yield built


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Debian's Chromium through Playwright (skips without it; see browser.py)."""
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable)
        yield launched
        launched.close()


@pytest.fixture
def tab(world: DashboardWorld, browser: Any, tmp_path: Path) -> Iterator[DashboardPage]:
    """A fresh browser context (no key stored yet) on the populated gateway. ``world``
    comes first: building it runs the gate (asyncio.run), which cannot start once
    Playwright's sync API holds an event loop in this thread."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    yield DashboardPage(context.new_page(), world.url, tmp_path)
    context.close()


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
    opened = SQLExperienceStore.from_url(url)
    opened.migrate()
    yield opened
    opened.close()

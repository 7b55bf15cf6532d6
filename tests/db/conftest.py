"""Fixtures: throwaway PostgreSQL databases (REEF_TEST_POSTGRES_URL) for the upgrade tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.experience.conftest import PG_ENV, ThrowawayDatabases


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[ThrowawayDatabases]:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is not set; the PostgreSQL upgrade tests need a server")
    databases = ThrowawayDatabases(url)
    yield databases
    databases.drop_all()

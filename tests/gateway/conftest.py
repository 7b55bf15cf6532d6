from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.experience.conftest import PG_ENV, ThrowawayDatabases
from tests.fakes.student import StudentThread
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread() as server:
        yield server


@pytest.fixture(scope="module")
def student() -> Iterator[StudentThread]:
    """A distilled scenario's student (``tests.fakes.student``)."""
    with StudentThread() as server:
        yield server


@pytest.fixture(scope="module")
def teacher() -> Iterator[FakeUpstreamThread]:
    """A distilled scenario's teacher: the fake upstream, on a port of its own."""
    with FakeUpstreamThread() as server:
        yield server


@pytest.fixture
def make_gateway(
    tmp_path: Path, fake: FakeUpstreamThread
) -> Iterator[Callable[..., GatewayThread]]:
    started: list[GatewayThread] = []

    def start(**overrides: Any) -> GatewayThread:
        gateway = GatewayThread(
            make_settings(tmp_path / str(len(started)), fake.base_url, **overrides)
        )
        started.append(gateway.__enter__())
        return gateway

    yield start
    for gateway in started:
        gateway.__exit__(None, None, None)


@pytest.fixture
def gateway(make_gateway: Callable[..., GatewayThread]) -> GatewayThread:
    return make_gateway()


@pytest.fixture(scope="module")
def module_gateway(
    tmp_path_factory: pytest.TempPathFactory, fake: FakeUpstreamThread
) -> Iterator[GatewayThread]:
    """One gateway shared by a module's tests: for the many requests that are refused or
    only read (a test that counts records compares before and after)."""
    with GatewayThread(make_settings(tmp_path_factory.mktemp("gateway"), fake.base_url)) as gw:
        yield gw


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A store that outlives one gateway (several at once, or one after another): a
    SQLite file, or a throwaway PostgreSQL database when REEF_TEST_POSTGRES_URL is set."""
    if request.param == "sqlite":
        yield {"url": f"sqlite:///{tmp_path / 'shared.db'}"}
        return
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is not set; PostgreSQL store tests need a server")
    databases = ThrowawayDatabases(url)
    try:
        yield {"url": databases.create()}
    finally:
        databases.drop_all()

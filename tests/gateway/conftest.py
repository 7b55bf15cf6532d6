from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstreamThread]:
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

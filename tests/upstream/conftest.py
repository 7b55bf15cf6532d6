"""A fake model server per test, and an HTTPUpstream pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.upstream import FakeUpstream


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    server = FakeUpstream(slow_interval=0.05)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()

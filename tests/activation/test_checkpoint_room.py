"""A checkpoint the engine has no memory for (507): the pool unloads the least recently
used checkpoint that nothing serves or uses and loads it again; with nothing it may
unload, the 507 stands and nothing changes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reef.config import UpstreamConfig
from reef.core.checkpoints import check_checkpoint_directory
from reef.engine.models import load_model
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from reef.gateway.serving.activation import AdapterPool
from reef.upstream import UpstreamError, build_upstream
from tests.engine.checkpoint_factory import make_letter_checkpoint

TINY = "tiny-random"


def test_a_checkpoint_that_does_not_fit_makes_room_by_unloading_the_least_recent(
    tmp_path: Path,
) -> None:
    paths = {c: make_letter_checkpoint(tmp_path / "ck" / c, c) for c in "abcd"}
    digests = {c: check_checkpoint_directory(p).digest for c, p in paths.items()}
    engine = Engine(load_model(TINY, tmp_path), max_batch=2, threads=1)
    # Room for one checkpoint beside the base weights, none for a second.
    engine.available_memory = lambda: 1 << 40 if engine.scheduler.stats()["weights"] <= 1 else 1024
    server = BackgroundServer(engine).start()

    async def scenario() -> None:
        config = UpstreamConfig(type="openai", base_url=server.base_url, model=TINY, max_retries=0)
        upstream = build_upstream("engine", config)
        pool = AdapterPool(upstream, limit=4, kind="checkpoint")
        unloaded: list[str] = []
        pool.on_unload = unloaded.append
        try:
            assert await pool.ensure("s@a", paths["a"], digests["a"], set())
            assert await pool.ensure("s@b", paths["b"], digests["b"], set())  # a made room
            assert list(pool.slots) == ["s@b"] and unloaded == ["s@a"]
            assert engine.checkpoints.has("s@b") and not engine.checkpoints.has("s@a")
            # What serves now (keep) and what a request still uses are never unloaded.
            for keep, in_use in ((set(), True), ({"s@b"}, False)):
                if in_use:
                    pool.acquire("s@b")
                with pytest.raises(UpstreamError) as info:
                    await pool.ensure("s@c", paths["c"], digests["c"], keep)
                assert info.value.upstream_status == 507
                assert list(pool.slots) == ["s@b"] and unloaded == ["s@a"]
                if in_use:
                    pool.release("s@b")
            assert await pool.ensure("s@d", paths["d"], digests["d"], set())
            assert list(pool.slots) == ["s@d"] and unloaded == ["s@a", "s@b"]
        finally:
            await upstream.aclose()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()

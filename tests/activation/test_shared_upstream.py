"""Two gateways' adapter pools on one engine: the second load of the same adapter is
not an error, and a pool that does not unload leaves the other's adapters alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reef.config import UpstreamConfig
from reef.engine.digest import adapter_digest
from reef.engine.models import load_model
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from reef.gateway.serving.activation import AdapterPool
from reef.upstream import Upstream, build_upstream
from tests.engine.lora_factory import PEFT_WRAP_WARNING, make_letter_adapter
from tests.fakes.upstream import FakeUpstream

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)


def test_pools_sharing_an_engine(tmp_path: Path) -> None:
    adapters = {letter: make_letter_adapter(tmp_path / letter, letter) for letter in "abc"}
    engine = BackgroundServer(Engine(load_model("tiny-random", tmp_path), max_batch=2, threads=1))
    engine.start()

    async def scenario() -> None:
        config = UpstreamConfig(type="openai", base_url=engine.base_url, model="tiny-random")
        upstreams = [build_upstream("engine", config) for _ in range(2)]
        try:
            await pools(*upstreams)
        finally:
            for upstream in upstreams:
                await upstream.aclose()

    async def pools(*upstreams: Upstream) -> None:
        first = AdapterPool(upstreams[0], limit=1)
        second = AdapterPool(upstreams[1], limit=1, unload=False)
        name, path = "s@aaaa", adapters["a"]
        assert await first.ensure(name, path, adapter_digest(path), set())
        # another gateway: the engine already has it, which is fine
        assert await second.ensure(name, path, adapter_digest(path), set())
        # the non-unloading pool keeps both loaded past its limit
        c = adapters["c"]
        await second.ensure("s@cccc", c, adapter_digest(c), set())
        assert list(second.slots) == ["s@aaaa", "s@cccc"]

    try:
        asyncio.run(scenario())
    finally:
        engine.stop()


def test_pools_sharing_a_vllm_shaped_upstream(tmp_path: Path) -> None:
    """vLLM refuses a second load with a 400 whose message alone says why."""
    path = make_letter_adapter(tmp_path / "a", "a")

    async def scenario() -> None:
        fake = FakeUpstream(adapters=True)
        await fake.start()
        config = UpstreamConfig(type="openai", base_url=fake.base_url, model="m", max_retries=0)
        upstreams = [build_upstream("vllm", config) for _ in range(2)]
        try:
            first = AdapterPool(upstreams[0], limit=1)
            second = AdapterPool(upstreams[1], limit=1, unload=False)
            assert await first.ensure("s@aaaa", path, adapter_digest(path), set())
            assert await second.ensure("s@aaaa", path, adapter_digest(path), set())
            assert list(second.slots) == ["s@aaaa"]
        finally:
            for upstream in upstreams:
                await upstream.aclose()
            await fake.stop()

    asyncio.run(scenario())

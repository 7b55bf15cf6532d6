"""Fixtures for the engine: a tiny-random engine on a loopback port, clients, adapters."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from a hub, ever
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from reef.engine.models import load_model
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from tests.engine.lora_factory import make_letter_adapter

TINY = "tiny-random"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BackgroundServer]:
    """A tiny-random engine serving on a free loopback port."""
    running = BackgroundServer(Engine(load_model(TINY, tmp_path), max_batch=8, threads=1)).start()
    yield running
    running.stop()


@pytest.fixture
async def client(server: BackgroundServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official OpenAI SDK pointed at ``server``; no retries hide failures."""
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


@dataclass
class Admin:
    """Raw HTTP to the engine for what the OpenAI SDK has no method for."""

    base_url: str
    session: aiohttp.ClientSession

    async def post(self, path: str, body: object) -> tuple[int, str]:
        """POST JSON; returns status and body text."""
        async with self.session.post(self.base_url + path, json=body) as response:
            return response.status, await response.text()

    async def get(self, path: str) -> tuple[int, str]:
        """GET; returns status and body text."""
        async with self.session.get(self.base_url + path) as response:
            return response.status, await response.text()

    async def load(self, name: str, path: Path, **extra: object) -> tuple[int, str]:
        """``POST /v1/load_lora_adapter``."""
        return await self.post(
            "/load_lora_adapter", {"lora_name": name, "lora_path": str(path), **extra}
        )

    async def unload(self, name: str) -> tuple[int, str]:
        """``POST /v1/unload_lora_adapter``."""
        return await self.post("/unload_lora_adapter", {"lora_name": name})


@pytest.fixture
async def admin(server: BackgroundServer) -> AsyncIterator[Admin]:
    """An :class:`Admin` for ``server``."""
    async with aiohttp.ClientSession() as session:
        yield Admin(server.base_url, session)


@pytest.fixture(scope="session")
def letter_adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two adapters for tiny-random: ``a`` makes it say "aaaa…", ``b`` "bbbb…"."""
    root = tmp_path_factory.mktemp("adapters")
    return {letter: make_letter_adapter(root / letter, letter) for letter in "ab"}

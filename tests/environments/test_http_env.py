"""The ``http`` environment against a real service on loopback: tools, reset, score,
a failing and a hanging call, an answer that is not JSON, the loopback rule."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from reef.environments import (
    EnvironmentSpecError,
    EpisodeError,
    HttpEnvironment,
    Task,
    build_environment,
)

TASK = Task("t1", ({"role": "user", "content": "hi"},), {"answer_contains": ["hello"]})
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"who": {"type": "string"}}},
        },
    }
    for name in ("greet", "fail", "slow", "raw", "big")
]


class Service:
    """The user's service: four routes, and what it was sent."""

    def __init__(self, scores: bool = True) -> None:
        self.scores = scores
        self.resets: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/env/tools", self._tools)
        app.router.add_post("/env/reset", self._reset)
        app.router.add_post("/env/call", self._call)
        if self.scores:
            app.router.add_post("/env/score", self._score)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/env"

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _tools(self, request: web.Request) -> web.Response:
        return web.json_response({"tools": TOOLS})

    async def _reset(self, request: web.Request) -> web.Response:
        self.resets.append(await request.json())
        return web.json_response({})

    async def _call(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(body)
        name = body["name"]
        if name == "fail":
            return web.Response(status=500, text="database is down")
        if name == "slow":
            await asyncio.Event().wait()
        if name == "raw":
            return web.Response(text="plain words")
        if name == "big":
            return web.json_response({"content": "z" * 1000})
        return web.json_response({"content": f"hello {body['arguments'].get('who', 'you')}"})

    async def _score(self, request: web.Request) -> web.Response:
        body = await request.json()
        said = body["messages"][-1].get("content", "")
        return web.json_response({"score": 1 if "hello" in said else 0, "reason": "service says"})


@pytest.fixture
async def service() -> AsyncIterator[Service]:
    server = Service()
    await server.start()
    yield server
    await server.stop()


def call(name: str, call_id: str = "c1", **arguments: Any) -> dict[str, Any]:
    payload = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": payload}


def http_env(base_url: str, **limits: Any) -> HttpEnvironment:
    env = build_environment({"type": "http", "base_url": base_url, "limits": limits})
    assert isinstance(env, HttpEnvironment)
    return env


async def test_tools_reset_calls_and_score_go_to_the_service(service: Service) -> None:
    async with http_env(service.base_url) as env:
        observation = await env.reset(TASK)
        assert [t["function"]["name"] for t in observation.tools][:2] == ["greet", "fail"]
        assert service.resets == [{"task": TASK.as_dict()}]
        (greet,) = (await env.step([call("greet", who="Ada")])).results
        assert (greet.status, greet.content) == ("ok", "hello Ada")
        assert service.calls == [{"task_id": "t1", "name": "greet", "arguments": {"who": "Ada"}}]
        said = [{"role": "assistant", "content": "hello Ada"}]
        assert (await env.score(TASK, said)).reason == "service says"
        assert (await env.score(TASK, said)).value == 1.0


async def test_a_failing_hanging_or_plain_text_call_is_a_result(service: Service) -> None:
    async with http_env(service.base_url, step_timeout_seconds=0.5) as env:
        await env.reset(TASK)
        fail, raw = (await env.step([call("fail"), call("raw", "c2")])).results
        (slow,) = (await env.step([call("slow", "c3")])).results
    assert (fail.status, fail.content) == (
        "error",
        "error: the service answered 500: database is down",
    )
    assert (raw.status, raw.content) == ("ok", "plain words")
    assert slow.status == "timeout"
    assert "did not finish within 0.5 s" in slow.content


async def test_the_output_cap_holds_for_a_service(service: Service) -> None:
    async with http_env(service.base_url, max_tool_output_chars=64) as env:
        await env.reset(TASK)
        (big,) = (await env.step([call("big")])).results
    assert big.truncated and "64 of 1000 characters" in big.content


async def test_a_service_without_score_is_scored_by_the_task() -> None:
    server = Service(scores=False)
    await server.start()
    try:
        async with http_env(server.base_url) as env:
            await env.reset(TASK)
            score = await env.score(TASK, [{"role": "assistant", "content": "bye"}])
    finally:
        await server.stop()
    assert (score.value, score.reason) == (0.0, "the answer lacks 'hello'")


async def test_a_service_that_is_down_fails_reset_clearly(service: Service) -> None:
    url = service.base_url
    await service.stop()
    with pytest.raises(EpisodeError, match=r"could not reach http://127\.0\.0\.1:.*/env/tools"):
        await http_env(url).reset(TASK)
    await service.start()  # the fixture stops it again


def test_only_loopback_unless_allowed() -> None:
    for url in ("http://localhost:8080", "http://127.0.0.2:1/x", "http://[::1]:9/"):
        assert isinstance(build_environment({"type": "http", "base_url": url}), HttpEnvironment)
    with pytest.raises(EnvironmentSpecError, match=r"host 'tools\.example\.com' is not loopback"):
        build_environment({"type": "http", "base_url": "https://tools.example.com"})
    with pytest.raises(EnvironmentSpecError, match="must be an http"):
        build_environment({"type": "http", "base_url": "file:///etc/passwd"})
    remote = {"type": "http", "base_url": "https://tools.example.com", "allow_remote": True}
    assert isinstance(build_environment(remote), HttpEnvironment)

"""The ``python`` environment: the orders toolset through its entry point, and tools
that hang, crash, kill their worker, print, overflow, dial out or eat memory and CPU —
each run in the tool worker (a child process), each a tool result saying what went
wrong."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from reef.environments import (
    EpisodeError,
    EpisodeLimits,
    PythonEnvironment,
    PythonEnvironmentConfig,
    SandboxConfig,
    Task,
    build_environment,
)

TASK = Task("t1", ({"role": "user", "content": "go"},), setup={"count": 10})


def call(name: str, call_id: str = "c1", **arguments: Any) -> dict[str, Any]:
    payload = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": payload}


def misbehaving(**options: Any) -> PythonEnvironment:
    limits = EpisodeLimits(step_timeout_seconds=options.pop("step", 5.0), max_tool_output_chars=200)
    config = PythonEnvironmentConfig(
        toolset="misbehaving", limits=limits, sandbox=SandboxConfig(**options)
    )
    return PythonEnvironment(config, module="tests.environments.toolsets")


@pytest.fixture
async def env() -> AsyncIterator[PythonEnvironment]:
    environment = misbehaving(step=1.0)
    await environment.reset(TASK)
    yield environment
    await environment.close()


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


async def test_the_orders_toolset_plays_an_episode_and_scores_its_state() -> None:
    env = build_environment({"type": "python", "toolset": "orders"})
    task = Task("ret", ({"role": "user", "content": "return A100"},), {"return_opened": "A100"})
    async with env:
        observation = await env.reset(task)
        names = [tool["function"]["name"] for tool in observation.tools]
        assert names == ["lookup_order", "check_stock", "open_return"]
        assert observation.tools[2]["function"]["parameters"]["required"] == ["order_id", "reason"]
        assert (await env.score(task, [])).reason == "no return was opened for A100"
        (late,) = (await env.step([call("open_return", order_id="A102", reason="x")])).results
        assert "past the 30-day return window" in late.content
        (opened,) = (await env.step([call("open_return", order_id="A100", reason="x")])).results
        assert json.loads(opened.content)["status"] == "opened"
        assert await env.score(task, []) == (await env.score(task, []))
        assert (await env.score(task, [])).value == 1.0
        await env.reset(task)  # a fresh worker: the return is gone
        assert (await env.score(task, [])).value == 0.0


async def test_state_lasts_the_episode_and_reset_seeds_it(env: PythonEnvironment) -> None:
    step = await env.step([call("count", "a"), call("count", "b")])
    assert [r.content for r in step.results] == ["11", "12"]


async def test_a_hanging_tool_is_killed_and_the_next_call_restarts_the_tools(
    env: PythonEnvironment,
) -> None:
    (hang,) = (await env.step([call("hang")])).results
    assert hang.status == "timeout"
    assert "did not finish within 1 s" in hang.content and "was stopped" in hang.content
    (after,) = (await env.step([call("count")])).results
    assert after.status == "ok"
    assert after.content.startswith("[the tools were restarted after the last failure")
    assert after.content.endswith("11")  # the state was seeded again, not kept


async def test_a_raising_tool_crashes_alone(env: PythonEnvironment) -> None:
    boom, after = (await env.step([call("boom"), call("count", "c2")])).results
    assert boom.status == "crashed"
    assert boom.content.startswith("error: tool 'boom' crashed: ValueError: boom (at boom, line")
    assert (after.status, after.content) == ("ok", "11")  # the worker lived on


async def test_a_tool_that_kills_its_worker_is_a_crash(env: PythonEnvironment) -> None:
    (died,) = (await env.step([call("die", code=3)])).results
    assert died.status == "crashed"
    assert "the tool worker exited with code 3" in died.content
    (after,) = (await env.step([call("echo", text="back")])).results
    assert after.status == "ok" and after.content.endswith("back")


async def test_output_is_capped_in_the_worker_and_marked(env: PythonEnvironment) -> None:
    (result,) = (await env.step([call("big", chars=5_000_000)])).results
    assert result.truncated
    assert result.content.startswith("x" * 200 + "\n[... output truncated")
    assert "200 of 5000000 characters" in result.content


async def test_what_a_tool_prints_does_not_corrupt_the_protocol(env: PythonEnvironment) -> None:
    (result,) = (await env.step([call("shout", text="la" * 50)])).results
    assert (result.status, result.content) == ("ok", "done")


async def test_the_network_is_denied_by_default(env: PythonEnvironment, listener: int) -> None:
    (result,) = (await env.step([call("dial", port=listener)])).results
    assert result.status == "crashed"
    assert "PermissionError: socket.getaddrinfo is not allowed" in result.content
    assert "this environment's tools have no network (at dial, line" in result.content


async def test_the_network_can_be_allowed(listener: int) -> None:
    env = misbehaving(network=True)
    async with env:
        await env.reset(TASK)
        (result,) = (await env.step([call("dial", port=listener)])).results
    assert (result.status, result.content) == ("ok", "connected")


@pytest.mark.parametrize("passed", [False, True], ids=["withheld", "passed"])
async def test_the_worker_sees_only_the_environment_variables_it_is_given(
    monkeypatch: pytest.MonkeyPatch, passed: bool
) -> None:
    monkeypatch.setenv("REEF_TEST_SECRET", "s3cret")
    env = misbehaving(pass_env=("REEF_TEST_SECRET",) if passed else ())
    async with env:
        await env.reset(TASK)
        secret, path = (
            await env.step(
                [call("getenv", variable="REEF_TEST_SECRET"), call("getenv", "c2", variable="PATH")]
            )
        ).results
    assert secret.content == ("s3cret" if passed else "<unset>")
    assert path.content != "<unset>"


async def test_the_memory_limit_holds() -> None:
    env = misbehaving(memory_mb=256)
    async with env:
        await env.reset(TASK)
        (result,) = (await env.step([call("hog", mib=1024)])).results
    assert result.status == "crashed"
    assert "MemoryError" in result.content


async def test_the_cpu_limit_kills_a_spinning_worker() -> None:
    env = misbehaving(cpu_seconds=1, step=10.0)
    async with env:
        await env.reset(TASK)
        (result,) = (await env.step([call("spin")])).results
    assert result.status == "crashed"
    assert "the tool worker was killed by SIGXCPU (its CPU time limit?)" in result.content


async def test_a_toolset_that_cannot_load_fails_reset_clearly() -> None:
    config = PythonEnvironmentConfig(toolset="broken")
    env = PythonEnvironment(config, module="tests.environments.broken_toolset")
    with pytest.raises(EpisodeError, match="failed to load: RuntimeError: this toolset is broken"):
        await env.reset(TASK)
    await env.close()

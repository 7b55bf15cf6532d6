"""The environment contract, on an in-process plugin: malformed calls from the model,
the output cap, a tool that hangs (the step's and the episode's deadlines), a tool that
crashes, the calls-per-step cap, scores, the registry and task files."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from reef.environments import (
    Environment,
    EnvironmentConfig,
    EnvironmentRegistry,
    EnvironmentSpecError,
    EpisodeError,
    EpisodeLimits,
    Observation,
    Score,
    Task,
    ToolError,
    UnknownEnvironmentError,
    build_environment,
    default_score,
    load_tasks,
)

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Say it back.",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    },
    {"type": "function", "function": {"name": "hang", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "boom", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "refuse", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "data", "parameters": {"type": "object"}}},
)


class Toy(Environment):
    """Tools on the event loop: the contract without a subprocess."""

    type_name = "toy"

    async def start_episode(self, task: Task) -> Observation:
        return Observation(task.messages, TOOLS)

    async def run_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        if name == "hang":
            await asyncio.Event().wait()
        if name == "boom":
            raise KeyError("missing")
        if name == "refuse":
            raise ToolError("the service said no")
        if name == "data":
            return {"b": 2, "a": [1]}
        return arguments["text"]

    async def score(self, task: Task, messages: Sequence[dict[str, Any]]) -> Score:
        return default_score(task, messages)


TASK = Task("t1", ({"role": "user", "content": "hi"},), {"answer_contains": ["hello"]})


def call(name: str, arguments: Any = "{}", call_id: str = "c1") -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def toy(**limits: Any) -> Toy:
    return Toy(EnvironmentConfig(limits=EpisodeLimits(**limits)))


async def test_step_before_reset_is_an_error() -> None:
    with pytest.raises(EpisodeError, match=r"step\(\) before reset\(\)"):
        await toy().step([call("echo", {"text": "x"})])


async def test_a_good_call_runs_and_answers_its_call_id() -> None:
    env = toy()
    await env.reset(TASK)
    step = await env.step([call("echo", {"text": "hello"}, "abc"), call("data", call_id="d")])
    first, second = step.results
    assert (first.tool_call_id, first.status, first.content) == ("abc", "ok", "hello")
    assert second.content == '{"a": [1], "b": 2}'  # a value is shown as JSON
    assert step.messages[0] == {"role": "tool", "tool_call_id": "abc", "content": "hello"}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("not a call", "tool call #0 is not an object (got str)"),
        ({"id": "c1", "type": "function", "function": {}}, "has no function name"),
        ({"id": "c1", "type": "retrieval", "function": {"name": "echo"}}, "only 'function'"),
        (call("delete_everything"), "unknown tool 'delete_everything'; the tools offered are:"),
        (call("echo", '{"text": '), "arguments of 'echo' are not valid JSON"),
        (call("echo", "[1, 2]"), "must be a JSON object, got list"),
        (call("echo", {}), "'text' is a required property"),
        (call("echo", {"text": 3}), "text: 3 is not of type 'string'"),
    ],
    ids=["not-object", "no-name", "wrong-type", "unknown", "bad-json", "list", "missing", "type"],
)
async def test_a_malformed_call_is_a_tool_result_not_a_crash(raw: Any, says: str) -> None:
    env = toy()
    await env.reset(TASK)
    (result,) = (await env.step([raw])).results
    assert result.status == "malformed"
    assert result.content.startswith("error: ")
    assert says in result.content
    assert result.tool_call_id == ("call_0" if not isinstance(raw, dict) else "c1")


async def test_calls_past_the_per_step_cap_are_not_run() -> None:
    env = toy(max_tool_calls_per_step=2)
    await env.reset(TASK)
    calls = [call("echo", {"text": str(i)}, f"c{i}") for i in range(3)]
    results = (await env.step(calls)).results
    assert [r.status for r in results] == ["ok", "ok", "malformed"]
    assert "at most 2 tool calls per step" in results[2].content


async def test_a_long_output_is_cut_with_a_marker() -> None:
    env = toy(max_tool_output_chars=100)
    await env.reset(TASK)
    (result,) = (await env.step([call("echo", {"text": "y" * 250})])).results
    assert result.truncated
    assert result.content.startswith("y" * 100 + "\n[... output truncated")
    assert "100 of 250 characters" in result.content


async def test_a_hanging_tool_times_out_and_the_rest_of_the_step_is_not_run() -> None:
    env = toy(step_timeout_seconds=0.3)
    await env.reset(TASK)
    hang, after = (await env.step([call("hang"), call("echo", {"text": "x"}, "c2")])).results
    assert hang.status == "timeout"
    assert "did not finish within 0.3 s (the step's time limit)" in hang.content
    assert after.status == "timeout"
    assert "not run: the step's time ran out" in after.content


async def test_the_episode_deadline_bounds_a_step() -> None:
    env = toy(step_timeout_seconds=30)
    await env.reset(TASK)
    (hang,) = (await env.step([call("hang")], deadline=time.monotonic() + 0.2)).results
    assert hang.status == "timeout"
    assert "the episode's time limit" in hang.content


async def test_a_crashing_tool_and_a_refusing_tool_say_so() -> None:
    env = toy()
    await env.reset(TASK)
    boom, refuse = (await env.step([call("boom"), call("refuse", call_id="c2")])).results
    assert boom.status == "crashed"
    assert boom.content == "error: tool 'boom' crashed: KeyError: 'missing'"
    assert (refuse.status, refuse.content) == ("error", "error: the service said no")


async def test_a_bad_tool_spec_from_the_environment_fails_reset() -> None:
    class Broken(Toy):
        async def start_episode(self, task: Task) -> Observation:
            return Observation(task.messages, ({"type": "function"},))

    with pytest.raises(EpisodeError, match="offered a bad tool"):
        await Broken(EnvironmentConfig()).reset(TASK)


def test_default_score_checks_the_answer_and_the_calls() -> None:
    task = Task("t", TASK.messages, {"answer_contains": ["Hello"], "tools_called": ["echo"]})
    answered = [{"role": "assistant", "content": "hello there"}]
    called = [{"role": "assistant", "tool_calls": [call("echo")]}, *answered]
    assert default_score(task, called) == Score(1.0, "every expected check holds")
    missed = default_score(task, answered)
    assert missed.value == 0.0 and missed.reason == "'echo' was never called"
    assert "has no 'answer_contains'" in default_score(Task("x", ()), answered).reason
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        Score(1.5, "too good")


def test_the_registry_finds_the_builtins_and_names_bad_keys() -> None:
    registry = EnvironmentRegistry()
    assert {"replay", "python", "http"} <= set(registry.known())
    with pytest.raises(UnknownEnvironmentError, match="unknown environment type 'gym'; known"):
        build_environment({"type": "gym"})
    with pytest.raises(EnvironmentSpecError, match="needs a 'type'"):
        build_environment({"toolset": "orders"})
    with pytest.raises(EnvironmentSpecError) as bad:
        build_environment({"type": "python", "toolset": "orders", "limts": {}}, where="env")
    allowed = "allowed keys here: limits, sandbox, tasks, toolset, type"
    assert f"unknown key 'env.limts'; {allowed}" in str(bad.value)
    with pytest.raises(EnvironmentSpecError, match=r"env.limits.max_turns: Input should be"):
        build_environment(
            {"type": "python", "toolset": "orders", "limits": {"max_turns": 0}}, where="env"
        )
    with pytest.raises(EnvironmentSpecError, match=r"unknown toolset 'shop'.*known: .*orders"):
        build_environment({"type": "python", "toolset": "shop"})
    local = EnvironmentRegistry({"toy": Toy}, entry_points_too=False)
    assert local.known() == ["toy"]
    assert isinstance(local.build({"type": "toy"}), Toy)


def test_tasks_from_a_file_and_their_errors(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        '{"id": "a", "prompt": "hi", "expected": {"answer_contains": ["x"]}}\n\n'
        '{"id": "b", "messages": [{"role": "user", "content": "yo"}], "setup": {"n": 1}}\n'
    )
    env = build_environment({"type": "python", "toolset": "orders", "tasks": str(path)})
    a, b = env.tasks()
    assert a.messages == ({"role": "user", "content": "hi"},) and a.expected["answer_contains"]
    assert b.setup == {"n": 1}
    for text, says in [
        ('{"id": "a", "prompt": "x", "expect": {}}', "line 1: unknown key(s) ['expect']"),
        ('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}', "line 2: task id 'a' appears"),
        ("{oops", "line 1: not JSON"),
        ('{"id": "a"}', "needs 'messages' (a non-empty list) or 'prompt'"),
        ("", "holds no tasks"),
    ]:
        path.write_text(text)
        with pytest.raises(EnvironmentSpecError, match=re.escape(says)):
            load_tasks(path)
    with pytest.raises(EnvironmentSpecError, match="generates no tasks"):
        toy().tasks()

"""docs/environments.md's plugin is real: its code, registered as the page says and
built from the page's YAML, plays an episode against a scripted model."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from reef.environments import (
    Environment,
    EnvironmentRegistry,
    EnvironmentSpecError,
    play_episode,
)
from tests.environments.episodes import endpoint
from tests.fakes.scripted import ScriptedChatThread, calls, tool_call

PAGE = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _block(language: str, first_line: str) -> str:
    blocks = [b for lang, b in _FENCE.findall(PAGE.read_text("utf-8")) if lang == language]
    return next(b for b in blocks if b.startswith(first_line))


def _plugin() -> type[Environment]:
    module = types.ModuleType("my_envs.counter")
    exec(compile(_block("python", "# my_envs/counter.py"), str(PAGE), "exec"), module.__dict__)
    cls = module.__dict__["CounterEnvironment"]
    assert isinstance(cls, type) and issubclass(cls, Environment)
    return cls


def _spec() -> dict[str, Any]:
    spec = yaml.safe_load(_block("yaml", "environment:\n  type: counter"))["environment"]
    assert isinstance(spec, dict)
    return spec


def test_the_page_registers_it_under_its_type_name() -> None:
    toml = _block("toml", '[project.entry-points."reef.environments"]')
    assert 'counter = "my_envs.counter:CounterEnvironment"' in toml
    assert _plugin().type_name == "counter"


async def test_the_documented_plugin_plays_an_episode() -> None:
    registry = EnvironmentRegistry({"counter": _plugin()}, entry_points_too=False)
    env = registry.build(_spec())
    (task,) = env.tasks()
    script = [
        calls(tool_call("a", "add", {"n": 1000})),
        calls(tool_call("b", "add", {"n": 3})),
        {"content": "done"},
    ]
    with ScriptedChatThread(script) as model:
        async with env:
            result = await play_episode(env, task, endpoint(model.base_url))
    assert (result.stop, result.turns, result.tool_calls) == ("finished", 3, 2)
    assert result.tool_status["error"] == 1
    assert result.messages[2]["content"] == "error: n must be between -100 and 100"
    assert (result.score.value, result.score.reason) == (1.0, "the counter is 5, the target 5")


def test_a_misspelt_key_is_refused_as_the_page_says() -> None:
    registry = EnvironmentRegistry({"counter": _plugin()}, entry_points_too=False)
    spec = {**_spec(), "strat": 2}
    with pytest.raises(EnvironmentSpecError) as refused:
        registry.build(spec, where="environment")
    said = "unknown key 'environment.strat'; allowed keys here: limits, start, tasks, type"
    assert said in str(refused.value)
    assert said in " ".join(PAGE.read_text("utf-8").split())

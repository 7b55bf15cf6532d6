"""The ``replay`` environment: tool results looked up in recorded trajectories, from a
hand-written recording and from an episode recorded live through the gateway."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reef.environments import (
    EnvironmentSpecError,
    ReplayEnvironment,
    ReplayEnvironmentConfig,
    Task,
    build_environment,
    run_episode,
)
from reef.environments.replay import call_key
from reef.experience import assemble_trajectory
from tests.environments.episodes import RETURN, SUPPORT_SCRIPT, endpoint, orders
from tests.fakes.scripted import ScriptedChatThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.polling import eventually

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}


def recorded_call(call_id: str, order: str) -> dict[str, Any]:
    return {"id": call_id, "name": "lookup_order", "arguments": json.dumps({"order_id": order})}


RECORDING = {
    "scenario": "support",
    "session_id": "s1",
    "turns": [
        {
            "index": 0,
            "messages": [{"role": "user", "content": "where is A100?"}],
            "tools": [LOOKUP],
            "tool_results": [],
        },
        {
            "index": 1,
            "messages": [],
            "tools": [LOOKUP],
            "tool_results": [
                {"tool_call_id": "a", "content": "shipped", "call": recorded_call("a", "A100")},
                {"tool_call_id": "b", "content": "delivered", "call": recorded_call("b", "A100")},
            ],
        },
    ],
}


def call(order: str, call_id: str = "c") -> dict[str, Any]:
    arguments = json.dumps({"order_id": order}, indent=2)  # spacing differs from the recording
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "lookup_order", "arguments": arguments},
    }


async def test_a_recorded_call_is_answered_from_the_recording() -> None:
    env = ReplayEnvironment(ReplayEnvironmentConfig(), [RECORDING])
    (task,) = env.tasks()
    assert task == Task(
        "s1", ({"role": "user", "content": "where is A100?"},), {"tools_called": ["lookup_order"]}
    )
    observation = await env.reset(task)
    assert observation.tools == (LOOKUP,)
    results = (await env.step([call("A100", "1"), call("A100", "2"), call("A100", "3")])).results
    assert [r.content for r in results] == ["shipped", "delivered", "delivered"]
    (unseen,) = (await env.step([call("Z9")])).results
    assert unseen.status == "unrecorded"
    assert unseen.content == (
        'error: no recorded result for lookup_order({"order_id":"Z9"}): the recording never '
        "made this call, so it cannot be replayed"
    )
    said = [
        {"role": "assistant", "tool_calls": [call("A100")]},
        {"role": "assistant", "content": "ok"},
    ]
    assert (await env.score(task, said)).value == 1.0


def test_recordings_from_a_file_and_their_errors(tmp_path: Path) -> None:
    path = tmp_path / "recorded.jsonl"
    path.write_text(json.dumps({"trajectory": RECORDING}) + "\n")  # the admin API's answer
    env = build_environment({"type": "replay", "recordings": str(path)})
    assert [task.id for task in env.tasks()] == ["s1"]
    with pytest.raises(EnvironmentSpecError, match="needs 'recordings:'"):
        build_environment({"type": "replay"})
    path.write_text("{nope\n")
    with pytest.raises(EnvironmentSpecError, match="line 1: not JSON"):
        build_environment({"type": "replay", "recordings": str(path)})
    path.write_text(json.dumps({"session_id": "s"}) + "\n")
    with pytest.raises(EnvironmentSpecError, match="needs 'session_id' and 'turns'"):
        build_environment({"type": "replay", "recordings": str(path)})


def test_call_keys_compare_arguments_as_json() -> None:
    assert (
        call_key("f", '{"b": 1, "a": 2}')
        == call_key("f", {"a": 2, "b": 1})
        == ("f", '{"a":2,"b":1}')
    )
    assert call_key("f", "not json") == ("f", "not json")


def test_an_episode_recorded_live_replays_with_the_same_results(tmp_path: Path) -> None:
    with (
        ScriptedChatThread(list(SUPPORT_SCRIPT)) as model,
        GatewayThread(make_settings(tmp_path, model.base_url)) as gateway,
    ):
        target = endpoint(gateway.url + "/v1", headers={"x-reef-scenario": "support"})
        live = run_episode(orders(), RETURN, target)
        assert (live.stop, live.score.value) == ("finished", 1.0)
        store, session = gateway.store, live.session_id
        records = eventually(
            lambda: (found := store.get_session("support", session)) and len(found) == 3 and found,
            "the live episode's three records",
        )
    trajectory = assemble_trajectory("support", session, records)
    replay = ReplayEnvironment.from_trajectories([trajectory])
    (task,) = replay.tasks()
    assert task.expected == {"tools_called": ["lookup_order", "check_stock", "open_return"]}
    with ScriptedChatThread(list(SUPPORT_SCRIPT)) as model:
        replayed = run_episode(replay, task, endpoint(model.base_url))
    assert (replayed.stop, replayed.score.value) == ("finished", 1.0)
    assert replayed.tool_status["ok"] == 3
    tool_texts = [m["content"] for m in replayed.messages if m["role"] == "tool"]
    assert tool_texts == [m["content"] for m in live.messages if m["role"] == "tool"]


FLAT_HISTORY = [  # canonical form, as trajectories hold it: flat calls, no null content
    {"role": "user", "content": "where is A100?"},
    {"role": "assistant", "tool_calls": [recorded_call("a", "A100")]},
    {"role": "tool", "tool_call_id": "a", "content": "shipped"},
    {"role": "user", "content": "and when does it arrive?"},
]
OPENAI_HISTORY = [
    FLAT_HISTORY[0],
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"order_id": "A100"}'},
            }
        ],
    },
    *FLAT_HISTORY[2:],
]


def test_a_task_with_recorded_tool_history_is_asked_in_openai_chat_form() -> None:
    """A trajectory whose first captured turn already carries tool calls: the task's
    messages, and what the model is sent, are OpenAI chat form."""
    recording = {**RECORDING, "turns": [{**RECORDING["turns"][0], "messages": FLAT_HISTORY}]}
    env = ReplayEnvironment(ReplayEnvironmentConfig(), [recording])
    (task,) = env.tasks()
    assert list(task.messages) == OPENAI_HISTORY
    with ScriptedChatThread([{"content": "Tomorrow."}]) as model:
        played = run_episode(env, task, endpoint(model.base_url))
    assert played.stop == "finished"
    assert model.requests[0]["messages"] == OPENAI_HISTORY

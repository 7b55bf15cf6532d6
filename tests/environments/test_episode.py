"""The episode runner end to end against real loopback servers: the scripted model and
``FakeUpstream`` (no mocked HTTP), and once through the Reef gateway, whose records of
the episode assemble into one trajectory."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from reef.environments import (
    ChatEndpoint,
    EpisodeLimits,
    PythonEnvironment,
    PythonEnvironmentConfig,
    Task,
    play_episode,
    run_episode,
)
from reef.experience import assemble_trajectory
from tests.environments.episodes import RETURN, SUPPORT_SCRIPT, endpoint, orders
from tests.fakes.scripted import ScriptedChatThread, calls, tool_call
from tests.fakes.upstream import FakeUpstream, FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.polling import eventually


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    server = FakeUpstream()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def scripted(request: pytest.FixtureRequest) -> Iterator[ScriptedChatThread]:
    with ScriptedChatThread(getattr(request, "param", ())) as server:
        yield server


@pytest.mark.parametrize("scripted", [SUPPORT_SCRIPT], indirect=True)
async def test_an_episode_plays_to_a_final_answer_and_scores_the_state(
    scripted: ScriptedChatThread,
) -> None:
    async with orders() as env:
        result = await play_episode(env, RETURN, endpoint(scripted.base_url))
    assert (result.stop, result.error) == ("finished", None)
    assert (result.score.value, result.score.reason) == (1.0, "every expected check holds")
    assert (result.turns, result.tool_calls, result.malformed_calls) == (3, 3, 0)
    assert result.tool_status["ok"] == 3
    assert result.record_ids == ("rec-1", "rec-2", "rec-3")
    # what the model was sent: the tools, then each turn's calls answered by id
    first, _, third = scripted.requests
    assert [t["function"]["name"] for t in first["tools"]] == [
        "lookup_order",
        "check_stock",
        "open_return",
    ]
    assert [m["role"] for m in third["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
    ]
    assert [m.get("tool_call_id") for m in third["messages"] if m["role"] == "tool"] == [
        "a",
        "b",
        "c",
    ]
    assert '"in_stock": 3' in third["messages"][4]["content"]
    sessions = {headers["x-reef-session"] for headers in scripted.headers}
    assert sessions == {result.session_id}
    assert result.as_dict()["reason"] == "every expected check holds"


async def test_malformed_arguments_from_the_model_are_counted_and_recoverable(
    fake: FakeUpstream,
) -> None:
    """FakeUpstream calls the first tool offered with {"city": "Paris"} when asked about
    the weather: lookup_order refuses those arguments, and the model reads why."""
    task = Task("weather", ({"role": "user", "content": "what is the weather?"},), RETURN.expected)
    async with orders() as env:
        result = await play_episode(env, task, endpoint(fake.base_url))
    assert result.stop == "finished"
    assert (result.turns, result.tool_calls, result.malformed_calls) == (2, 1, 1)
    tool_message = result.messages[2]
    assert "'order_id' is a required property" in tool_message["content"]
    assert result.messages[-1]["content"].startswith("tool said: error: the arguments of")
    assert result.score.value == 0.0
    assert "no return was opened for A100" in result.score.reason


@pytest.mark.parametrize(
    "scripted",
    [[{"content": None, "tool_calls": ["garbage", {"function": {"name": "check_stock"}}]}]],
    indirect=True,
)
async def test_broken_calls_are_answered_under_ids_the_next_request_can_carry(
    scripted: ScriptedChatThread,
) -> None:
    async with orders() as env:
        result = await play_episode(env, RETURN, endpoint(scripted.base_url))
    assert result.stop == "finished"
    assert result.malformed_calls == 2
    resent = scripted.requests[1]["messages"]
    assert [c["id"] for c in resent[1]["tool_calls"]] == ["call_0", "call_1"]
    assert resent[1]["tool_calls"][0]["function"]["name"] == "invalid"
    assert [m["tool_call_id"] for m in resent[2:]] == ["call_0", "call_1"]
    assert resent[2]["content"] == "error: tool call #0 is not an object (got str)"
    assert "'item' is a required property" in resent[3]["content"]


@pytest.mark.parametrize(
    "scripted", [[{"content": None, "tool_calls": {"id": "x"}}]], indirect=True
)
async def test_a_reply_whose_tool_calls_are_not_a_list_stops_as_malformed(
    scripted: ScriptedChatThread,
) -> None:
    async with orders() as env:
        result = await play_episode(env, RETURN, endpoint(scripted.base_url))
    assert result.stop == "malformed"
    assert result.error == "the reply's tool_calls is a dict, not a list"
    assert result.score.value == 0.0


async def test_a_reply_that_is_not_json_stops_as_malformed(fake: FakeUpstream) -> None:
    task = Task("bad", ({"role": "user", "content": "malformed-json please"},), RETURN.expected)
    async with orders() as env:
        result = await play_episode(env, task, endpoint(fake.base_url))
    assert result.stop == "malformed"
    assert result.error is not None and result.error.startswith("the reply is not JSON")
    assert result.turns == 0


async def test_a_model_that_hangs_ends_the_episode_at_its_time_limit(fake: FakeUpstream) -> None:
    task = Task("hang", ({"role": "user", "content": "hang"},), RETURN.expected)
    async with orders(episode_timeout_seconds=0.5) as env:
        result = await play_episode(env, task, endpoint(fake.base_url))
    assert result.stop == "timeout"
    assert result.error == "the episode ran past its 0.5 s limit waiting for the model"


async def test_a_slow_call_within_the_episode_is_the_calls_error(fake: FakeUpstream) -> None:
    task = Task("hang", ({"role": "user", "content": "hang"},), RETURN.expected)
    async with orders() as env:
        result = await play_episode(env, task, endpoint(fake.base_url, timeout_seconds=0.3))
    assert result.stop == "error"
    assert result.error == "the model did not answer within 0.3 s"


@pytest.mark.parametrize(
    "scripted",
    [[calls(tool_call(str(n), "check_stock", {"item": "kettle"})) for n in range(5)]],
    indirect=True,
)
async def test_the_turn_limit_ends_an_agent_that_never_answers(
    scripted: ScriptedChatThread,
) -> None:
    async with orders(max_turns=2) as env:
        result = await play_episode(env, RETURN, endpoint(scripted.base_url))
    assert result.stop == "max_turns"
    assert result.error == "no final answer within 2 turns"
    assert (result.turns, result.tool_calls) == (2, 2)
    assert len(scripted.requests) == 2


@pytest.mark.parametrize(
    "scripted",
    [[calls(tool_call("h", "hang", {})), {"content": "gave up on it"}]],
    indirect=True,
)
async def test_a_hanging_tool_costs_its_step_not_the_episode(
    scripted: ScriptedChatThread,
) -> None:
    limits = EpisodeLimits(step_timeout_seconds=0.5)
    config = PythonEnvironmentConfig(toolset="misbehaving", limits=limits)
    task = Task("t", ({"role": "user", "content": "go"},), {"answer_contains": ["gave up"]})
    async with PythonEnvironment(config, module="tests.environments.toolsets") as env:
        result = await play_episode(env, task, endpoint(scripted.base_url))
    assert (result.stop, result.score.value) == ("finished", 1.0)
    assert result.tool_status["timeout"] == 1
    assert "did not finish within 0.5 s" in result.messages[2]["content"]


@pytest.mark.parametrize("scripted", [[{"content": "hi"}]], indirect=True)
async def test_a_session_pinned_by_the_caller_is_kept(scripted: ScriptedChatThread) -> None:
    target = endpoint(
        scripted.base_url, headers={"X-Reef-Session": "mine"}, params={"stream": True}
    )
    async with orders() as env:
        result = await play_episode(env, RETURN, target)
    assert (result.stop, result.session_id) == ("finished", "mine")
    assert scripted.headers[0]["x-reef-session"] == "mine"
    assert "stream" not in scripted.requests[0]


async def test_an_endpoint_that_is_down_is_an_error_stop() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with orders() as env:
        result = await play_episode(env, RETURN, endpoint(f"http://127.0.0.1:{port}/v1"))
    assert result.stop == "error"
    assert result.error is not None and result.error.startswith("could not reach")


def test_run_episode_through_the_gateway_records_one_trajectory(tmp_path: Path) -> None:
    task = Task("weather", ({"role": "user", "content": "what is the weather?"},), RETURN.expected)
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        target = endpoint(gateway.url + "/v1", headers={"x-reef-scenario": "support"})
        result = run_episode(orders(), task, target)
        assert (result.stop, result.turns, result.malformed_calls) == ("finished", 2, 1)
        assert len(result.record_ids) == 2
        store, session = gateway.store, result.session_id
        records = eventually(
            lambda: (found := store.get_session("support", session)) and len(found) == 2 and found,
            "the episode's two records",
        )
        trajectory = assemble_trajectory("support", result.session_id, records)
    turns = sorted(trajectory.turns.values(), key=lambda turn: turn.index)
    assert [turn.link for turn in turns] == ["start", "continues"]
    assert turns[1].tool_results[0]["call"]["name"] == "lookup_order"
    assert {turn.answered.record_id for turn in turns} == set(result.record_ids)


@pytest.mark.parametrize("scripted", [[{"content": "It shipped."}]], indirect=True)
async def test_first_messages_with_flat_tool_calls_are_sent_in_openai_chat_form(
    scripted: ScriptedChatThread,
) -> None:
    """A task written from recorded traffic may hold canonical messages (a flat call,
    no content beside it); the model gets them in OpenAI chat form."""
    flat = {"role": "assistant", "tool_calls": [{"id": "a", "name": "lookup_order"}]}
    task = Task(
        "flat",
        (
            {"role": "user", "content": "where is A100?"},
            {**flat, "tool_calls": [{**flat["tool_calls"][0], "arguments": '{"order_id":"A100"}'}]},
            {"role": "tool", "tool_call_id": "a", "content": "shipped"},
        ),
        {},
    )
    async with orders() as env:
        result = await play_episode(env, task, endpoint(scripted.base_url))
    assert result.stop == "finished"
    sent = scripted.requests[0]["messages"][1]
    assert sent == {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("a", "lookup_order", {"order_id": "A100"})],
    }


def test_an_episode_on_an_anthropic_upstream_is_played_through_messages(tmp_path: Path) -> None:
    """The gateway serves a scenario on an Anthropic upstream on /v1/messages only: each
    turn goes out as a Messages request (tool results as ``tool_result`` blocks) and its
    answer comes back in chat form, so the episode plays as on any other upstream."""
    task = Task("weather", ({"role": "user", "content": "what is the weather?"},), RETURN.expected)
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        target = ChatEndpoint(
            base_url=gateway.url + "/v1",
            model="reef/claude",
            headers={"x-reef-scenario": "claude"},
            dialect="anthropic",
        )
        result = run_episode(orders(), task, target)
        assert (result.stop, result.error) == ("finished", None)
        assert (result.turns, result.malformed_calls) == (2, 1)
        last = fake.last_request_body  # the second turn, as the upstream got it
        assert last["model"] == "fake-claude"
        blocks = [b for m in last["messages"] for b in m["content"] if isinstance(b, dict)]
        assert [b["type"] for b in blocks if b["type"] != "text"] == ["tool_use", "tool_result"]
        records = [gateway.store.get_record(r) for r in result.record_ids]
        assert {r.api for r in records} == {"anthropic.messages"}

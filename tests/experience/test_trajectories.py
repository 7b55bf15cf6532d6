"""Trajectory assembly from real records: an agent loop through the official SDKs and the
gateway in front of the fake upstream, on SQLite and PostgreSQL (REEF_TEST_POSTGRES_URL),
for the OpenAI and Anthropic dialects, one test per case of issue 13 item 1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.core import new_id
from reef.experience.trajectories import Trajectory, Turn, assemble_trajectory
from tests.experience.agent import Agent, Call, Dialect
from tests.experience.conftest import ThrowawayDatabases, pg_databases  # noqa: F401 - fixture
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

DIALECTS: list[Dialect] = ["openai", "anthropic"]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread() as server:
        yield server


@pytest.fixture(
    scope="module",
    params=[pytest.param("sqlite"), pytest.param("postgresql", marks=pytest.mark.postgres)],
)
def gateway(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    fake: FakeUpstreamThread,
) -> Iterator[GatewayThread]:
    """One gateway per backend for the module; each test uses sessions of its own."""
    home = tmp_path_factory.mktemp("trajectories")
    if request.param == "sqlite":
        url = f"sqlite:///{home / 'reef.db'}"
    else:
        databases: ThrowawayDatabases = request.getfixturevalue("pg_databases")
        url = databases.create()
    with GatewayThread(make_settings(Path(home), fake.base_url, store={"url": url})) as gw:
        yield gw


def trajectory(agent: Agent, session: str) -> Trajectory:
    records = agent.gateway.store.get_session(agent.scenario, session)
    return assemble_trajectory(agent.scenario, session, records)


def ordered(found: Trajectory) -> list[Turn]:
    return sorted(found.turns.values(), key=lambda turn: turn.index)


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [message["role"] for message in messages]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_tool_loop_is_a_chain_of_turns_with_calls_and_results(
    gateway: GatewayThread, dialect: Dialect, stream: bool
) -> None:
    agent = Agent(gateway, dialect, stream=stream, system="You are a weather bot.")
    first = agent.user("what is the weather in Paris?").ask()
    (call,) = first.calls
    assert call.name == "get_weather"
    second = agent.results((call, "sunny, 21 C")).ask()
    third = agent.user("thanks!").ask(tools=False)
    assert first.session_id == second.session_id == third.session_id  # inferred by prefix

    found = trajectory(agent, first.session_id)
    turns = ordered(found)
    assert [t.link for t in turns] == ["start", "continues", "continues"]
    assert [t.parent for t in turns] == [None, turns[0].id, turns[1].id]
    assert [t.answered.record_id for t in turns] == [s.record_id for s in (first, second, third)]
    assert [b.records for b in found.branches] == [
        (first.record_id, second.record_id, third.record_id)
    ]
    # the first turn: system prompt, the user's question, the tools, a tool call whose
    # streamed arguments are whole again
    assert turns[0].system == "You are a weather bot."
    assert roles(turns[0].new_messages) == ["system", "user"]
    assert turns[0].tools[0]["function"]["name"] == "get_weather"
    assert turns[0].tools[0]["function"]["parameters"]["required"] == ["city"]
    reply = turns[0].answered.reply
    assert reply is not None
    paris = {"id": call.id, "name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert reply["tool_calls"] == [paris]
    # the second: exactly the tool result, paired with the call it answers
    assert roles(turns[1].new_messages) == ["tool"]
    assert turns[1].tool_results == [
        {"tool_call_id": call.id, "content": "sunny, 21 C", "call": reply["tool_calls"][0]}
    ]
    assert turns[1].answered.reply == {"role": "assistant", "content": "tool said: sunny, 21 C"}
    # the third: a user message, no tools offered
    assert turns[2].new_messages == [{"role": "user", "content": "thanks!"}]
    assert turns[2].tools == [] and not turns[2].system_changed


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_parallel_tool_calls_and_their_results_stay_paired(
    gateway: GatewayThread, dialect: Dialect, stream: bool
) -> None:
    agent = Agent(gateway, dialect, stream=stream)
    first = agent.user("weather in Paris and Rome, in parallel").ask()
    paris, rome = first.calls
    assert paris.id != rome.id
    agent.results((paris, "sunny"), (rome, "rain")).ask()

    turns = ordered(trajectory(agent, first.session_id))
    assert len(turns) == 2
    reply = turns[0].answered.reply
    assert reply is not None
    assert [(c["id"], c["arguments"]) for c in reply["tool_calls"]] == [
        (paris.id, '{"city":"Paris"}'),
        (rome.id, '{"city":"Rome"}'),
    ]
    results = turns[1].tool_results
    assert [(r["tool_call_id"], r["content"]) for r in results] == [
        (paris.id, "sunny"),
        (rome.id, "rain"),
    ]
    assert [r["call"]["arguments"] for r in results] == ['{"city":"Paris"}', '{"city":"Rome"}']


@pytest.mark.parametrize("dialect", DIALECTS)
def test_two_continuations_of_one_prefix_are_two_branches(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent = Agent(gateway, dialect)
    first = agent.user("hello there").ask(tools=False)
    left, right = agent.fork(), agent.fork()
    one = left.user("tell me about Paris").ask(tools=False)
    two = right.user("tell me about Rome").ask(tools=False)
    three = right.user("and Milan?").ask(tools=False)
    assert {one.session_id, two.session_id, three.session_id} == {first.session_id}

    found = trajectory(agent, first.session_id)
    root = found.turns[found.roots[0]]
    assert len(found.roots) == 1 and len(root.children) == 2
    assert sorted(b.records for b in found.branches) == sorted(
        [
            (first.record_id, one.record_id),
            (first.record_id, two.record_id, three.record_id),
        ]
    )
    assert found.main_branch().records[-1] == three.record_id  # the newest leaf
    assert found.branch_through(one.record_id).records == (first.record_id, one.record_id)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_resent_request_is_a_retry_not_a_new_turn(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent = Agent(gateway, dialect)
    first = agent.user("what is the weather?").ask()
    (call,) = first.calls
    agent.results((call, "cloudy"))
    again = agent.ask(keep=False)  # the agent timed out and sends the same request again
    final = agent.ask()
    assert {again.session_id, final.session_id} == {first.session_id}

    found = trajectory(agent, first.session_id)
    turns = ordered(found)
    assert len(turns) == 2
    assert [a.record_id for a in turns[1].attempts] == [again.record_id, final.record_id]
    assert turns[1].answered.record_id == final.record_id
    assert found.branches[0].records == (first.record_id, final.record_id)
    assert turns[1].as_dict()["retries"] == 1


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_resent_first_request_is_a_retry_too(gateway: GatewayThread, dialect: Dialect) -> None:
    # A first request carries no earlier reply, so only a session header joins its retry.
    agent = Agent(gateway, dialect, session=f"retry-{new_id()}")
    first = agent.user("hello").ask(tools=False, keep=False)
    again = agent.ask(tools=False)
    turns = ordered(trajectory(agent, first.session_id))
    assert len(turns) == 1
    assert [a.record_id for a in turns[0].attempts] == [first.record_id, again.record_id]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_compacted_history_continues_the_turn_it_still_carries(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent = Agent(gateway, dialect, session=f"compact-{new_id()}")
    agent.user("first question").ask(tools=False)
    agent.user("second question").ask(tools=False)
    third = agent.user("weather please").ask()
    (call,) = third.calls
    # The framework summarises the first turns away, keeps the last call, adds the result.
    agent.history = [
        {"role": "user", "content": "summary of earlier turns\nweather please"},
        _reply_message(dialect, call),
    ]
    fourth = agent.results((call, "windy")).ask()

    turns = ordered(trajectory(agent, third.session_id))
    assert [t.link for t in turns] == ["start", "continues", "continues", "compacted"]
    assert turns[3].parent == turns[2].id and turns[3].parent_record_id == third.record_id
    assert roles(turns[3].new_messages) == ["tool"]
    assert turns[3].tool_results[0]["call"]["name"] == "get_weather"
    assert turns[3].answered.record_id == fourth.record_id
    # nothing the request held is lost: the summary is in its messages
    assert "summary of earlier turns" in str(turns[3].messages)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_history_summarised_past_every_reply_continues_the_newest_turn(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent = Agent(gateway, dialect, session=f"summary-{new_id()}")
    agent.user("first question").ask(tools=False)
    second = agent.user("second question").ask(tools=False)
    agent.history = [{"role": "user", "content": "summary: two questions asked"}]
    agent.history += [{"role": "assistant", "content": "noted"}]
    third = agent.user("third question").ask(tools=False)

    turns = ordered(trajectory(agent, second.session_id))
    assert [t.link for t in turns] == ["start", "continues", "compacted"]
    assert turns[2].parent_record_id == second.record_id
    assert turns[2].new_messages == [{"role": "user", "content": "third question"}]
    assert turns[2].answered.record_id == third.record_id


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_changed_system_prompt_still_continues_the_conversation(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent = Agent(gateway, dialect, session=f"system-{new_id()}", system="It is Monday.")
    first = agent.user("what day is it?").ask(tools=False)
    agent.system = "It is Tuesday."
    second = agent.user("and now?").ask(tools=False)

    turns = ordered(trajectory(agent, first.session_id))
    assert [t.link for t in turns] == ["start", "system_changed"]
    assert turns[1].system_changed and turns[1].system == "It is Tuesday."
    assert turns[1].parent_record_id == first.record_id
    assert turns[1].new_messages == [{"role": "user", "content": "and now?"}]
    assert turns[1].answered.record_id == second.record_id


@pytest.mark.parametrize("dialect", DIALECTS)
def test_nothing_of_the_recorded_messages_is_lost(gateway: GatewayThread, dialect: Dialect) -> None:
    agent = Agent(gateway, dialect, stream=True)
    first = agent.user("weather in Paris and Rome, in parallel").ask()
    agent.results(*((call, f"result {call.id}") for call in first.calls)).ask()
    found = trajectory(agent, first.session_id)
    dumped = found.as_dict()
    for record in gateway.store.get_session(agent.scenario, first.session_id):
        for call_id, name in _call_ids(record.request, record.response):
            assert call_id in str(dumped) and name in str(dumped)
    last = ordered(found)[-1]
    # the last request's messages, every one: user, assistant with both calls, results
    calls = [m for m in last.messages if m.get("tool_calls")]
    assert [len(m["tool_calls"]) for m in calls] == [2]
    assert [m["tool_call_id"] for m in last.messages if m["role"] == "tool"] == [
        call.id for call in first.calls
    ]


def _reply_message(dialect: Dialect, call: Call) -> dict[str, Any]:
    """The assistant message carrying ``call``, as the SDK gave it back."""
    if dialect == "openai":
        function = {"name": call.name, "arguments": '{"city": "Paris"}'}
        return {
            "role": "assistant",
            "tool_calls": [{"id": call.id, "type": "function", "function": function}],
        }
    block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {"city": "Paris"}}
    return {"role": "assistant", "content": [block]}


def _call_ids(request: dict[str, Any], response: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Every (tool call id, name) in a raw record, whichever the dialect."""
    found: list[tuple[str, str]] = []
    messages = list(request.get("messages") or [])
    if response is not None:
        messages += [c.get("message", {}) for c in response.get("choices") or ()]
        if "content" in response:
            messages.append({"content": response["content"]})
    for message in messages:
        for call in message.get("tool_calls") or ():
            found.append((call["id"], call["function"]["name"]))
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if block.get("type") == "tool_use":
                found.append((block["id"], block["name"]))
            if block.get("type") == "tool_result":
                found.append((block["tool_use_id"], ""))
    return found

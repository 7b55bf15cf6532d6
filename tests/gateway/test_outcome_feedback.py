"""``POST /reef/feedback`` with a ``session_id``: the outcome of a session's task, stored
attributable to the session (optionally targeting one turn, with a text or tool-call
correction), shown in the session's trajectory; validation names the field. SQLite and
PostgreSQL (REEF_TEST_POSTGRES_URL)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.experience.agent import Agent, Sent
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import RawResponse, call

LOOKUP = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}


def post(gateway: GatewayThread, body: dict[str, Any], path: str = "/reef/feedback") -> RawResponse:
    return call(gateway.port, "POST", path, body, {"x-reef-scenario": "support"})


def tool_session(gateway: GatewayThread) -> tuple[Sent, Sent]:
    agent = Agent(gateway, "openai")
    first = agent.user("what is the weather?").ask()
    second = agent.results((first.calls[0], "sunny")).ask()
    return first, second


def test_an_outcome_is_stored_with_its_session_and_shown_in_the_trajectory(
    make_gateway: Callable[..., GatewayThread],
    shared_store: dict[str, str],
) -> None:
    gateway = make_gateway(store=shared_store)
    first, second = tool_session(gateway)
    outcome = post(gateway, {"session_id": first.session_id, "score": 0, "feedback": "failed"})
    assert outcome.status == 201, outcome.body
    assert outcome.json()["session_id"] == first.session_id
    assert outcome.json()["record_ids"] == []
    corrected = post(
        gateway,
        {
            "session_id": first.session_id,
            "record_ids": [first.record_id],
            "score": 0,
            "correction": {"tool_calls": [LOOKUP]},
            "idempotency_key": "outcome-1",
        },
    )
    assert corrected.status == 201, corrected.body
    again = post(
        gateway,
        {
            "session_id": first.session_id,
            "record_ids": [first.record_id],
            "score": 0,
            "correction": {"tool_calls": [LOOKUP]},
            "idempotency_key": "outcome-1",
        },
    )
    assert again.status == 200 and again.json()["id"] == corrected.json()["id"]

    stored = gateway.store.get_feedback(corrected.json()["id"])
    assert stored.session_id == first.session_id and stored.record_ids == (first.record_id,)
    assert stored.correction == {"tool_calls": [LOOKUP]}
    outcomes = gateway.store.session_feedback("support", first.session_id)
    assert [o.id for o in outcomes] == [outcome.json()["id"], corrected.json()["id"]]
    # the targeted turn carries it as its feedback too; the untargeted outcome no record
    assert [f.id for f in gateway.store.get_record(first.record_id).feedback] == [stored.id]
    assert gateway.store.get_record(second.record_id).feedback == ()

    path = f"/reef/scenarios/support/sessions/{first.session_id}"
    tree = call(gateway.port, "GET", path).json()["trajectory"]
    assert [o["id"] for o in tree["outcomes"]] == [o.id for o in outcomes]
    assert tree["outcomes"][0]["session_id"] == first.session_id
    listed = call(gateway.port, "GET", "/reef/scenarios/support/feedback").json()["data"]
    assert {row["session_id"] for row in listed} == {first.session_id}


def test_report_takes_a_session_too(make_gateway: Callable[..., GatewayThread]) -> None:
    gateway = make_gateway()
    first, _ = tool_session(gateway)
    reported = post(gateway, {"session_id": first.session_id, "score": 1}, "/reef/report")
    assert reported.status == 201, reported.body
    one = post(
        gateway,
        {"session_id": first.session_id, "references": [first.record_id], "score": 1},
        "/reef/report",
    )
    assert one.status == 201 and one.json()["record_ids"] == [first.record_id]


@pytest.mark.parametrize(
    ("body", "status", "names"),
    [
        ({"score": 1}, 400, "record_ids or session_id is required"),
        ({"session_id": "", "score": 1}, 400, "session_id"),
        ({"session_id": "SESSION", "record_ids": ["FIRST", "SECOND"]}, 400, "record_ids"),
        ({"session_id": "SESSION", "record_ids": ["OTHER"], "score": 1}, 400, "record_ids"),
        ({"session_id": "no-such-session", "score": 1}, 404, "no-such-session"),
        ({"session_id": "SESSION", "score": 7}, 400, "score range"),
        (
            {"session_id": "SESSION", "correction": {"tool_calls": []}},
            400,
            "correction.tool_calls must be a non-empty list",
        ),
        (
            {"session_id": "SESSION", "correction": {"tool_calls": [{"function": {}}]}},
            400,
            "correction.tool_calls[0].function.name",
        ),
        (
            {
                "record_ids": ["FIRST"],
                "correction": {"tool_calls": [{"name": "f", "arguments": "{"}]},
            },
            400,
            "correction.tool_calls[0].arguments is not JSON",
        ),
        (
            {"session_id": "SESSION", "correction": {"tool_calls": [LOOKUP], "content": 3}},
            400,
            "correction.content",
        ),
    ],
)
def test_invalid_outcomes_are_refused_naming_the_field(
    make_gateway: Callable[..., GatewayThread], body: dict[str, Any], status: int, names: str
) -> None:
    gateway = make_gateway()
    first, second = tool_session(gateway)
    other = Agent(gateway, "openai").user("another task").ask(tools=False)
    names_of = {
        "SESSION": first.session_id,
        "FIRST": first.record_id,
        "SECOND": second.record_id,
        "OTHER": other.record_id,
    }
    filled = {
        key: (
            [names_of.get(v, v) for v in value]
            if isinstance(value, list)
            else names_of.get(value, value)
            if isinstance(value, str)
            else value
        )
        for key, value in body.items()
    }
    answer = post(gateway, filled)
    assert answer.status == status, answer.body
    assert names in answer.json()["error"]["message"]

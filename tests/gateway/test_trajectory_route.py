"""``GET /reef/scenarios/{s}/sessions/{id}``: the trajectory tree, as documented (the
answer validates against the OpenAPI document's ``Session`` schema), behind admin auth
and scenario scoping; SQLite and PostgreSQL (REEF_TEST_POSTGRES_URL)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema

from reef.gateway.openapi.document import openapi_document
from tests.experience.agent import Agent
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

KEYS = {
    "keys": [
        {"id": "ops", "key": "sk-admin", "role": "admin"},
        {"id": "ops-claude", "key": "sk-claude-admin", "role": "admin", "scenarios": ["claude"]},
        {"id": "app", "key": "sk-app", "role": "inference"},
    ]
}
ADMIN = {"authorization": "Bearer sk-admin"}


def session_schema() -> dict[str, Any]:
    document = openapi_document()
    return {"$ref": "#/components/schemas/Session", "components": document["components"]}


def test_the_session_route_returns_the_documented_tree(
    make_gateway: Callable[..., GatewayThread], shared_store: dict[str, str]
) -> None:
    gateway = make_gateway(store=shared_store, auth=KEYS)
    agent = Agent(gateway, "openai", system="Be brief.", key="sk-app")
    first = agent.user("weather in Paris and Rome, in parallel").ask()
    agent.results(*((c, f"{c.id}: mild") for c in first.calls))
    retried = agent.ask(keep=False)
    second = agent.ask()
    path = f"/reef/scenarios/support/sessions/{first.session_id}"

    answer = call(gateway.port, "GET", path, headers=ADMIN)
    assert answer.status == 200, answer.body
    body = answer.json()
    jsonschema.validate(body, session_schema())
    assert [r["id"] for r in body["turns"]] == [
        first.record_id,
        retried.record_id,
        second.record_id,
    ]
    tree = body["trajectory"]
    assert tree["roots"] == [first.record_id]
    root, reply_turn = tree["turns"]
    assert root["children"] == [reply_turn["id"]] and reply_turn["parent"] == root["id"]
    assert [c["name"] for c in root["reply"]["tool_calls"]] == ["get_weather", "get_weather"]
    assert root["tools"][0]["function"]["name"] == "get_weather"
    assert root["system"] == "Be brief."
    assert [r["tool_call_id"] for r in reply_turn["tool_results"]] == [c.id for c in first.calls]
    assert reply_turn["retries"] == 1 and reply_turn["record_id"] == second.record_id
    assert tree["branches"] == [
        {
            "turns": [root["id"], reply_turn["id"]],
            "records": [first.record_id, second.record_id],
            "leaf": reply_turn["id"],
        }
    ]
    assert tree["main_branch"] == tree["branches"][0]


def test_the_session_route_is_admin_only_scoped_and_404s_unknown_sessions(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(auth=KEYS)
    agent = Agent(gateway, "openai", key="sk-app")
    sent = agent.user("hello").ask(tools=False)
    path = f"/reef/scenarios/support/sessions/{sent.session_id}"

    assert call(gateway.port, "GET", path).status == 401
    assert call(gateway.port, "GET", path, headers={"authorization": "Bearer sk-app"}).status == 403
    scoped = call(gateway.port, "GET", path, headers={"authorization": "Bearer sk-claude-admin"})
    assert scoped.status == 403 and "support" in scoped.json()["error"]["message"]
    missing = call(gateway.port, "GET", "/reef/scenarios/support/sessions/nope", headers=ADMIN)
    assert missing.status == 404 and "nope" in missing.json()["error"]["message"]
    elsewhere = f"/reef/scenarios/claude/sessions/{sent.session_id}"
    assert call(gateway.port, "GET", elsewhere, headers=ADMIN).status == 404

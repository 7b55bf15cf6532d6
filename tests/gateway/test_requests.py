"""Bad input and authentication: right status, the dialect's shape, a message that helps."""

from __future__ import annotations

import hashlib

import anthropic
import openai
import pytest

from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

CHAT = "/v1/chat/completions"
KEYS = {
    "keys": [
        {"id": "app", "key": "sk-app", "role": "inference"},
        {"id": "support-only", "key": "sk-support", "role": "inference", "scenarios": ["support"]},
        {"id": "ops", "sha256": hashlib.sha256(b"sk-admin").hexdigest(), "role": "admin"},
    ]
}


def test_malformed_json_is_400_naming_the_problem(gateway: GatewayThread) -> None:
    response = call(gateway.port, "POST", CHAT, b'{"messages": [')
    assert response.status == 400
    assert "not valid JSON" in response.json()["error"]["message"]


def test_missing_messages_is_400(gateway: GatewayThread) -> None:
    response = call(gateway.port, "POST", CHAT, {"model": "reef/support"})
    assert response.status == 400
    assert response.json()["error"]["message"] == "request body is missing 'messages'"
    response = call(gateway.port, "POST", "/v1/messages", {"model": "x", "max_tokens": 1})
    assert response.status == 400
    assert response.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "request body is missing 'messages'"},
    }


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"messages": []}, "non-empty"),
        ({"messages": ["hi"]}, "messages[0]"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_bodies(gateway: GatewayThread, body: object, fragment: str) -> None:
    import json

    response = call(gateway.port, "POST", CHAT, json.dumps(body).encode())
    assert response.status == 400
    assert fragment in response.json()["error"]["message"]


def test_bad_scenario_name_is_400(gateway: GatewayThread) -> None:
    response = call(
        gateway.port,
        "POST",
        CHAT,
        {"messages": [{"role": "user", "content": "x"}]},
        {"x-reef-scenario": "../etc"},
    )
    assert response.status == 400
    assert "invalid scenario name" in response.json()["error"]["message"]


def test_body_over_the_limit_is_413(make_gateway) -> None:  # type: ignore[no-untyped-def]
    gateway = make_gateway(server={"max_body_bytes": 1000})
    big = {"messages": [{"role": "user", "content": "x" * 2000}]}
    response = call(gateway.port, "POST", CHAT, big)
    assert response.status == 413
    assert "exceeds the limit of 1000 bytes" in response.json()["error"]["message"]


def test_unknown_route_is_json_404(gateway: GatewayThread) -> None:
    response = call(gateway.port, "GET", "/v1/nothing-here")
    assert response.status == 404
    assert "/v1/nothing-here" in response.json()["error"]["message"]


def test_scenario_without_a_model_is_400(make_gateway) -> None:  # type: ignore[no-untyped-def]
    gateway = make_gateway(
        upstreams={"bare": {"type": "openai", "base_url": "http://127.0.0.1:9/v1"}}, scenarios={}
    )
    response = call(
        gateway.port,
        "POST",
        CHAT,
        {"model": "reef/x", "messages": [{"role": "user", "content": "q"}]},
    )
    assert response.status == 400
    assert "has no model configured" in response.json()["error"]["message"]


def test_auth_required_with_keys(make_gateway) -> None:  # type: ignore[no-untyped-def]
    gateway = make_gateway(auth=KEYS)
    body = {"model": "reef/support", "messages": [{"role": "user", "content": "x"}]}
    missing = call(gateway.port, "POST", CHAT, body)
    assert missing.status == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    wrong = call(gateway.port, "POST", CHAT, body, {"authorization": "Bearer sk-nope"})
    assert wrong.status == 401
    assert wrong.json()["error"]["message"] == "invalid API key"
    ok = call(gateway.port, "POST", CHAT, body, {"authorization": "Bearer sk-app"})
    assert ok.status == 200
    record = gateway.store.get_record(ok.headers["x-reef-record-id"])
    assert record.principal == "app"
    # the gateway never stores the caller's credentials
    assert "sk-app" not in str(record.request) and "sk-app" not in str(record.tags)

    with pytest.raises(anthropic.AuthenticationError) as info:
        gateway.anthropic("sk-nope").messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    message = gateway.anthropic("sk-app").messages.create(
        model="m",
        max_tokens=5,
        messages=[{"role": "user", "content": "x"}],
        extra_headers={"x-reef-scenario": "support"},
    )
    assert message.content


def test_scoped_key_and_admin_routes(make_gateway) -> None:  # type: ignore[no-untyped-def]
    gateway = make_gateway(auth=KEYS)
    scoped = gateway.openai("sk-support")
    assert scoped.chat.completions.create(
        model="reef/support", messages=[{"role": "user", "content": "ok"}]
    ).choices
    with pytest.raises(openai.PermissionDeniedError) as info:
        scoped.chat.completions.create(
            model="reef/other", messages=[{"role": "user", "content": "no"}]
        )
    assert "may not use scenario 'other'" in info.value.message

    records = "/reef/scenarios/support/records"
    assert (
        call(gateway.port, "GET", records, headers={"authorization": "Bearer sk-app"}).status == 403
    )
    assert call(gateway.port, "GET", records, headers={"x-api-key": "sk-admin"}).status == 200
    assert call(gateway.port, "GET", "/metrics").status == 401
    assert call(gateway.port, "GET", "/metrics", headers={"x-api-key": "sk-admin"}).status == 200
    # health checks stay open
    assert call(gateway.port, "GET", "/healthz").status == 200

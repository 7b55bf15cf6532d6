"""Browser-safe by default: bodies must be declared JSON (415), ``Host`` must name the
gateway (400 naming ``server.allowed_hosts``), an ``Origin`` must be the gateway's own or
in ``server.allowed_origins`` (403, GET included), CORS preflights from others fail; each
in the caller's dialect. A keyless gateway binds loopback only and its banner says so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from reef.cli.serving import effective_host, ready_message
from reef.config import ReefSettings
from reef.gateway.browser_policy import HostAllowList, host_name
from reef.jobs import JobQueue
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import RawResponse, call

CHAT = {"model": "reef/support", "messages": [{"role": "user", "content": "hello"}]}
MESSAGES = {**CHAT, "max_tokens": 16}
EVIL = "http://evil.example"


def send(
    gateway: GatewayThread,
    method: str,
    path: str,
    body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> RawResponse:
    """One request with exactly ``headers`` (no Content-Type unless given)."""
    return call(gateway.port, method, path, body, headers, json_default=False)


def message_of(answer: RawResponse, dialect: str) -> str:
    """The error's message, checking the error is in ``dialect``'s shape."""
    body = answer.json()
    if dialect == "anthropic":
        assert body["type"] == "error" and "type" in body["error"], body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return str(body["error"]["message"])


JSON = {"content-type": "application/json"}
ROUTES = [
    ("/v1/chat/completions", CHAT, "openai"),
    ("/v1/messages", MESSAGES, "anthropic"),
    ("/reef/feedback", {"record_ids": ["r"], "score": 1}, "openai"),
]


def _records(gateway: GatewayThread) -> int:
    page = gateway.store.list_records("support", _no_filter(), None, 500)
    return len(page.records)


def _no_filter() -> Any:
    from reef.experience import RecordFilter

    return RecordFilter()


@pytest.mark.parametrize(("path", "body", "dialect"), ROUTES)
@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
     "multipart/form-data; boundary=x", "application/jsonp", "text/json"],
)  # fmt: skip
def test_a_body_that_is_not_declared_json_is_415(
    module_gateway: GatewayThread,
    path: str,
    body: dict[str, Any],
    dialect: str,
    content_type: str | None,
) -> None:
    before = _records(module_gateway)
    headers = {} if content_type is None else {"content-type": content_type}
    answer = send(module_gateway, "POST", path, body, headers)
    assert answer.status == 415, answer.body
    message = message_of(answer, dialect)
    assert "Content-Type: application/json" in message and path in message, message
    assert _records(module_gateway) == before  # refused before anything ran


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "Application/JSON; charset=UTF-8", "application/vnd.reef+json"],
)
def test_json_media_types_are_accepted(module_gateway: GatewayThread, content_type: str) -> None:
    answer = send(
        module_gateway, "POST", "/v1/chat/completions", CHAT, {"content-type": content_type}
    )
    assert answer.status == 200, answer.body
    anthropic = send(
        module_gateway, "POST", "/v1/messages", MESSAGES, {"content-type": content_type}
    )
    assert anthropic.status == 200, anthropic.body


def test_a_route_without_a_body_takes_none_or_json(
    make_gateway: Callable[..., GatewayThread], tmp_path: Path
) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learners: [{type: fewshot, k: 2}]\n")
    gateway = make_gateway(scenarios={"x": {"recipe": recipe}, "y": {"recipe": recipe}})
    jobs = JobQueue(gateway.database)
    learn = "/reef/scenarios/x/learn"
    for headers, body in (
        ({"content-type": "text/plain"}, b"a=b"),
        ({"content-type": "application/x-www-form-urlencoded"}, b""),
        ({}, b"{}"),  # a body with no media type (a Blob a page posts): refused
    ):
        answer = send(gateway, "POST", learn, body, headers)
        assert answer.status == 415, (headers, answer.body)
        assert "takes no body" in message_of(answer, "openai")
    assert jobs.list("x") == []
    assert send(gateway, "POST", learn).status == 202  # the CLI and dashboard: no body
    assert send(gateway, "POST", "/reef/scenarios/y/learn", b"", JSON).status == 202
    assert len(jobs.list("x")) == 1


def test_the_sdks_pass(module_gateway: GatewayThread) -> None:
    # Both send 'Content-Type: application/json' (a GET too) and no Origin.
    reply = module_gateway.openai().chat.completions.create(
        model="reef/support", messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].message.content
    message = module_gateway.anthropic().messages.create(
        model="reef/support", max_tokens=16, messages=[{"role": "user", "content": "hello"}]
    )
    assert message.content
    assert module_gateway.openai().models.list().data


@pytest.mark.parametrize(
    ("method", "path", "body", "dialect"),
    [
        ("POST", "/v1/chat/completions", CHAT, "openai"),
        ("POST", "/v1/messages", MESSAGES, "anthropic"),
        ("GET", "/reef/scenarios/support/records", None, "openai"),
        ("GET", "/ui/", None, "openai"),
    ],
)
def test_a_host_that_is_not_the_gateway_is_400(
    module_gateway: GatewayThread, method: str, path: str, body: Any, dialect: str
) -> None:
    answer = send(module_gateway, method, path, body, {**JSON, "host": "attacker.example"})
    assert answer.status == 400, answer.body
    message = message_of(answer, dialect)
    assert "server.allowed_hosts" in message and "attacker.example" in message, message


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:8600", "127.0.0.1", "127.0.0.2:1", "[::1]:8600", "[::1]"]
)
def test_loopback_hosts_are_answered(module_gateway: GatewayThread, host: str) -> None:
    answer = send(module_gateway, "GET", "/reef/scenarios/support/records", None, {"host": host})
    assert answer.status == 200, answer.body


def test_probes_are_answered_whatever_the_host(module_gateway: GatewayThread) -> None:
    for path in ("/healthz", "/readyz"):
        assert send(module_gateway, "GET", path, None, {"host": "10.1.2.3:8600"}).status == 200
    assert send(module_gateway, "GET", "/metrics", None, {"host": "10.1.2.3:8600"}).status == 400


def test_allowed_hosts_and_the_bound_host_are_answered(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(
        server={"host": "reef.internal", "allowed_hosts": [".example.com", "*.corp.test"]}
    )
    for host, status in (
        ("reef.internal:8600", 200),
        ("example.com", 200),
        ("api.example.com", 200),
        ("example.com.evil.test", 400),
        ("a.corp.test", 200),
        ("corp.test", 400),
        ("evilexample.com", 400),
    ):
        answer = send(gateway, "GET", "/reef/status", None, {"host": host})
        assert answer.status == status, (host, answer.body)


def test_host_names_and_the_allow_list() -> None:
    assert host_name("[::1]:8600") == "::1"
    assert host_name("Example.COM.:443") == "example.com"
    assert host_name("::1") == "::1"
    hosts = HostAllowList(["*"])
    assert hosts.allows("anything.test")
    settings = ReefSettings.model_validate(
        {"server": {"host": "0.0.0.0"}, "evaluation": {"gateway_url": "http://reef-gw:8600"}}
    )
    from_settings = HostAllowList.from_settings(settings)
    assert from_settings.allows("reef-gw:8600")  # the worker's own calls
    assert not from_settings.allows("0.0.0.0:8600")  # a wildcard bind names no host


@pytest.mark.parametrize(
    ("method", "path", "body", "dialect"),
    [
        ("GET", "/reef/scenarios/support/records", None, "openai"),
        ("GET", "/v1/models", None, "openai"),
        ("POST", "/v1/chat/completions", CHAT, "openai"),
        ("POST", "/v1/messages", MESSAGES, "anthropic"),
        ("POST", "/reef/scenarios/x/learn", None, "openai"),
    ],
)
@pytest.mark.parametrize("origin", [EVIL, "null", "http://127.0.0.1:1"])
def test_a_foreign_origin_is_refused_on_every_route(
    module_gateway: GatewayThread, method: str, path: str, body: Any, dialect: str, origin: str
) -> None:
    answer = send(module_gateway, method, path, body, {**JSON, "origin": origin})
    assert answer.status == 403, answer.body
    assert "server.allowed_origins" in message_of(answer, dialect)
    assert "access-control-allow-origin" not in answer.headers


def test_the_gateways_own_origin_is_the_dashboard(module_gateway: GatewayThread) -> None:
    own = f"http://127.0.0.1:{module_gateway.port}"
    answer = send(module_gateway, "GET", "/reef/scenarios", None, {"origin": own})
    assert answer.status == 200, answer.body
    assert "access-control-allow-origin" not in answer.headers  # same origin needs none


def test_a_cross_site_request_without_an_origin_is_refused(module_gateway: GatewayThread) -> None:
    # What Chromium sends for an <img> or <script> of another site: no Origin.
    fetched = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}
    answer = send(module_gateway, "GET", "/reef/scenarios/support/records", None, fetched)
    assert answer.status == 403, answer.body
    # A link followed from another site opens the page.
    followed = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"}
    assert send(module_gateway, "GET", "/ui/", None, followed).status == 200


@pytest.mark.parametrize(("path", "dialect"), [("/v1/chat/completions", "openai"),
                                               ("/v1/messages", "anthropic")])  # fmt: skip
def test_preflight_fails_for_an_unknown_origin(
    module_gateway: GatewayThread, path: str, dialect: str
) -> None:
    asked = {
        "origin": EVIL,
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type, authorization",
    }
    answer = send(module_gateway, "OPTIONS", path, None, asked)
    assert answer.status == 403, answer.body
    assert "access-control-allow-origin" not in answer.headers
    assert "server.allowed_origins" in message_of(answer, dialect)


def test_an_allowed_origin_gets_cors(make_gateway: Callable[..., GatewayThread]) -> None:
    app = "https://app.example.com"
    gateway = make_gateway(server={"allowed_origins": [app + "/"]})
    asked = {
        "origin": app,
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type, x-reef-session",
    }
    preflight = send(gateway, "OPTIONS", "/v1/chat/completions", None, asked)
    assert preflight.status == 204, preflight.body
    assert preflight.headers["access-control-allow-origin"] == app
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-headers"] == "content-type, x-reef-session"
    answer = send(gateway, "POST", "/v1/chat/completions", CHAT, {**JSON, "origin": app})
    assert answer.status == 200, answer.body
    assert answer.headers["access-control-allow-origin"] == app
    assert "x-reef-record-id" in answer.headers["access-control-expose-headers"]
    assert "credentials" not in " ".join(answer.headers)  # keys travel in headers only
    other = send(gateway, "POST", "/v1/chat/completions", CHAT, {**JSON, "origin": EVIL})
    assert other.status == 403


@pytest.mark.parametrize(
    ("setting", "value", "problem"),
    [
        ("allowed_origins", ["app.example.com"], "is not an origin"),
        ("allowed_origins", ["https://app.example.com/path"], "is not an origin"),
        ("allowed_origins", ["*"], "is not an origin"),
        ("allowed_hosts", ["http://reef.example.com"], "is not a host name"),
        ("allowed_hosts", ["reef.*.com"], "is not a host name"),
    ],
)
def test_malformed_settings_are_refused(setting: str, value: list[str], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        ReefSettings.model_validate({"server": {setting: value}})


def test_a_keyless_gateway_binds_loopback_and_its_banner_says_it_has_no_keys() -> None:
    assert (
        effective_host(ReefSettings.model_validate({"server": {"host": "0.0.0.0"}})) == "127.0.0.1"
    )
    assert effective_host(ReefSettings()) == "127.0.0.1"
    keyed = ReefSettings.model_validate(
        {"auth": {"keys": [{"id": "k", "key": "sk", "role": "admin"}]}}
    )
    assert effective_host(keyed) == "0.0.0.0"
    banner = ready_message("http://127.0.0.1:8600", 0)
    assert "keys       none:" in banner and "auth.keys" in banner and "admin" in banner
    assert "required (2 configured" in ready_message("http://127.0.0.1:8600", 2)

"""Every value Reef stores from a request header is bounded (400 beyond, naming the header
and its limit), and every session id it accepts can be read back through the admin API."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from reef.core.jsoncodec import MAX_DEPTH
from reef.experience import RecordFilter
from reef.gateway.body_checks import MAX_CHOICES, MAX_COUNT
from reef.gateway.openapi.document import INFERENCE_HEADERS, openapi_document
from reef.gateway.requests import (
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_RELEASE_ID_CHARS,
    MAX_SESSION_ID_CHARS,
    MAX_TAG_NAME_CHARS,
    MAX_TAG_VALUE_CHARS,
    MAX_TAGS,
)
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import RawResponse, call

CHAT = "/v1/chat/completions"
BODY = {"model": "reef/support", "messages": [{"role": "user", "content": "hello"}]}
ANTHROPIC_BODY = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}


def stored(gateway: GatewayThread) -> int:
    return len(gateway.store.list_records("support", RecordFilter(), None, 500).records)


def tags(count: int) -> dict[str, str]:
    return {f"x-reef-tag-t{index}": "v" for index in range(count)}


TOO_LONG: list[tuple[dict[str, str], str, int]] = [
    ({"x-reef-session": "s" * (MAX_SESSION_ID_CHARS + 1)}, "x-reef-session", MAX_SESSION_ID_CHARS),
    ({"x-reef-session": "s" * 60_000}, "x-reef-session", MAX_SESSION_ID_CHARS),
    (
        {"x-reef-idempotency-key": "k" * (MAX_IDEMPOTENCY_KEY_CHARS + 1)},
        "x-reef-idempotency-key",
        MAX_IDEMPOTENCY_KEY_CHARS,
    ),
    ({"x-reef-release": "r" * (MAX_RELEASE_ID_CHARS + 1)}, "x-reef-release", MAX_RELEASE_ID_CHARS),
    (
        {"x-reef-tag-" + "n" * (MAX_TAG_NAME_CHARS + 1): "v"},
        "x-reef-tag-" + "n" * (MAX_TAG_NAME_CHARS + 1),
        MAX_TAG_NAME_CHARS,
    ),
    ({"x-reef-tag-team": "v" * (MAX_TAG_VALUE_CHARS + 1)}, "x-reef-tag-team", MAX_TAG_VALUE_CHARS),
    ({"x-reef-tag-team": "v" * 60_000}, "x-reef-tag-team", MAX_TAG_VALUE_CHARS),
    ({"x-reef-end-user": "u" * (MAX_TAG_VALUE_CHARS + 1)}, "x-reef-end-user", MAX_TAG_VALUE_CHARS),
    (tags(MAX_TAGS + 1), "x-reef-tag-", MAX_TAGS),
    (tags(300), "x-reef-tag-", MAX_TAGS),
]


@pytest.mark.parametrize(("headers", "named", "limit"), TOO_LONG)
def test_a_header_past_its_limit_is_400_naming_it_and_nothing_is_stored(
    module_gateway: GatewayThread, headers: dict[str, str], named: str, limit: int
) -> None:
    before = stored(module_gateway)
    response = call(module_gateway.port, "POST", CHAT, BODY, headers)
    assert response.status == 400, response.body
    message = response.json()["error"]["message"]
    assert named in message and str(limit) in message, message
    assert stored(module_gateway) == before


def test_a_tag_reef_reserves_is_400_naming_it_and_nothing_is_stored(
    module_gateway: GatewayThread,
) -> None:
    """An imported record's origin is a ``reef.`` tag: live traffic cannot claim one."""
    before = stored(module_gateway)
    for name in ("reef.origin", "reef.source_id", "Reef.Origin"):
        response = call(module_gateway.port, "POST", CHAT, BODY, {f"x-reef-tag-{name}": "import:x"})
        assert response.status == 400, response.body
        message = response.json()["error"]["message"]
        assert "x-reef-tag-reef." in message and "reserves" in message, message
    assert stored(module_gateway) == before


def test_a_header_past_its_limit_on_messages_is_400_in_anthropic_shape(
    module_gateway: GatewayThread,
) -> None:
    headers = {"x-reef-scenario": "support", "x-reef-session": "s" * 1000}
    response = call(module_gateway.port, "POST", "/v1/messages", ANTHROPIC_BODY, headers)
    assert response.status == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "x-reef-session" in error["error"]["message"]


def test_values_at_their_limits_are_stored_whole(module_gateway: GatewayThread) -> None:
    session = "s" * MAX_SESSION_ID_CHARS
    key = "k" * MAX_IDEMPOTENCY_KEY_CHARS
    long_name = "n" * MAX_TAG_NAME_CHARS
    headers = {
        "x-reef-session": session,
        "x-reef-idempotency-key": key,
        **tags(MAX_TAGS - 1),
        "x-reef-tag-" + long_name: "v" * MAX_TAG_VALUE_CHARS,
    }
    response = call(module_gateway.port, "POST", CHAT, BODY, headers)
    assert response.status == 200, response.body
    record = module_gateway.store.get_record(response.headers["x-reef-record-id"])
    assert record.session_id == session
    assert record.idempotency_key == key
    assert len(record.tags) == MAX_TAGS
    assert record.tags[long_name] == "v" * MAX_TAG_VALUE_CHARS


# -- session ids -------------------------------------------------------------------------


REFUSED_SESSIONS = ["a/b", "../x", ".hidden", "two words", "-dash", "a?b", "é", "a%2Fb"]
ACCEPTED_SESSIONS = ["user-7:conv.2@app+x=1~", "a" * MAX_SESSION_ID_CHARS, "0", "A.B_C"]


@pytest.mark.parametrize("session", REFUSED_SESSIONS)
def test_a_session_id_outside_the_safe_charset_is_400(
    module_gateway: GatewayThread, session: str
) -> None:
    before = stored(module_gateway)
    response = call(module_gateway.port, "POST", CHAT, BODY, {"x-reef-session": session})
    assert response.status == 400, response.body
    assert "x-reef-session" in response.json()["error"]["message"]
    assert stored(module_gateway) == before


def read_session(gateway: GatewayThread, session: str) -> RawResponse:
    quoted = urllib.parse.quote(session, safe="")
    return call(gateway.port, "GET", f"/reef/scenarios/support/sessions/{quoted}")


@pytest.mark.parametrize("session", ACCEPTED_SESSIONS)
def test_every_accepted_session_id_reads_back(module_gateway: GatewayThread, session: str) -> None:
    response = call(module_gateway.port, "POST", CHAT, BODY, {"x-reef-session": session})
    assert response.status == 200, response.body
    assert response.headers["x-reef-session-id"] == session
    read = read_session(module_gateway, session)
    assert read.status == 200, read.body
    turns: list[dict[str, Any]] = read.json()["turns"]
    assert response.headers["x-reef-record-id"] in [turn["id"] for turn in turns]


def test_a_session_the_gateway_names_reads_back(module_gateway: GatewayThread) -> None:
    response = call(module_gateway.port, "POST", CHAT, BODY)
    assert response.status == 200
    read = read_session(module_gateway, response.headers["x-reef-session-id"])
    assert read.status == 200
    assert [turn["id"] for turn in read.json()["turns"]] == [response.headers["x-reef-record-id"]]


def test_the_document_states_the_header_limits() -> None:
    schemas = {header["name"]: header["schema"] for header in INFERENCE_HEADERS}
    assert schemas["x-reef-session"]["maxLength"] == MAX_SESSION_ID_CHARS
    assert schemas["x-reef-idempotency-key"]["maxLength"] == MAX_IDEMPOTENCY_KEY_CHARS
    assert schemas["x-reef-release"]["maxLength"] == MAX_RELEASE_ID_CHARS
    assert schemas["x-reef-scenario"]["maxLength"] == 64
    session = re.compile(schemas["x-reef-session"]["pattern"])
    assert all(session.search(s) for s in ACCEPTED_SESSIONS)
    assert not any(session.search(s) for s in REFUSED_SESSIONS)
    assert not session.search("s" * (MAX_SESSION_ID_CHARS + 1))
    chat = openapi_document()["paths"]["/v1/chat/completions"]["post"]["description"]
    assert f"Up to {MAX_TAGS} `x-reef-tag-<name>` headers" in chat
    assert f"at most {MAX_TAG_NAME_CHARS} characters" in chat
    assert f"at most {MAX_TAG_VALUE_CHARS})" in chat


def test_docs_state_the_limits() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "http-api.md").read_text("utf-8")
    rows = {
        "x-reef-session": f"1-{MAX_SESSION_ID_CHARS} letters, digits and `._:@~+=-`",
        "x-reef-idempotency-key": f"{MAX_IDEMPOTENCY_KEY_CHARS} characters",
        "x-reef-release": f"{MAX_RELEASE_ID_CHARS} characters",
        "x-reef-tag-<name>": f"{MAX_TAGS} tag headers per request; names of at most "
        f"{MAX_TAG_NAME_CHARS} characters, values of at most {MAX_TAG_VALUE_CHARS}",
    }
    for header, limit in rows.items():
        assert f"| `{header}` | {limit}" in docs, header
    assert f"nested deeper than {MAX_DEPTH} levels" in docs
    assert f"an integer from 1 to {MAX_COUNT}" in docs
    assert f"an integer from 1 to {MAX_CHOICES}" in docs


HEADER_VALUES: list[tuple[str, str, bool]] = [
    # (header, value, accepted): what the gateway does is what the document says
    ("x-reef-scenario", "", True),  # empty: no header (the model names the scenario)
    ("x-reef-scenario", "support", True),
    ("x-reef-scenario", "sup port", False),
    ("x-reef-scenario", "s" * 65, False),
    ("x-reef-session", "", True),
    ("x-reef-session", "a.b:c@d~e+f=g-h", True),
    ("x-reef-session", "-starts-with-a-dash", False),
    ("x-reef-release", "", True),
    ("x-reef-release", "r" * (MAX_RELEASE_ID_CHARS + 1), False),
    ("x-reef-idempotency-key", "", True),
    ("x-reef-idempotency-key", "k" * (MAX_IDEMPOTENCY_KEY_CHARS + 1), False),
    ("x-reef-purpose", "", True),
    ("x-reef-purpose", "EVAL", True),
    ("x-reef-purpose", "Serve", True),
    ("x-reef-purpose", "train", False),
    ("x-reef-capture", "OFF", True),
    ("x-reef-capture", "anything", True),
]


@pytest.mark.parametrize(("header", "value", "accepted"), HEADER_VALUES)
def test_a_reef_header_is_accepted_exactly_when_the_document_allows_it(
    module_gateway: GatewayThread, header: str, value: str, accepted: bool
) -> None:
    schema = {h["name"]: h["schema"] for h in INFERENCE_HEADERS}[header]
    assert (not list(jsonschema.Draft202012Validator(schema).iter_errors(value))) is accepted
    response = call(module_gateway.port, "POST", CHAT, BODY, {header: value})
    assert (response.status == 200) is accepted, response.body
    if not accepted:
        assert response.status == 400
        assert header in response.json()["error"]["message"]

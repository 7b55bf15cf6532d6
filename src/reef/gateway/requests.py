"""Reading what a client sent: the JSON body within limits, and Reef's request headers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

import orjson
from starlette.requests import ClientDisconnect, Request

from reef.core.errors import InvalidInputError
from reef.experience import Purpose
from reef.gateway.errors import PayloadTooLargeError

_SCENARIO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TAG_PREFIX = "x-reef-tag-"
# What a caller may declare: evaluation traffic is recorded but never trained on.
# ("canary" is set by the gateway itself for the canary arm of live traffic.)
_CALLER_PURPOSES = ("serve", "eval")
SCENARIO_MODEL_PREFIX = "reef/"


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object. Raises ``PayloadTooLargeError`` past ``max_bytes`` and
    ``InvalidInputError`` saying what is wrong with malformed JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError(
            f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes"
        )
    # Straight from ASGI ``receive``: Starlette's body stream adds an async generator per
    # request, and this runs on every inference request.
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLargeError(f"request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
        more = message.get("more_body", False)
    raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if not raw:
        raise InvalidInputError("request body is empty; send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidInputError("request body must be a JSON object")
    return body


def check_messages(body: dict[str, Any]) -> list[Any]:
    """The non-empty ``messages`` list, or ``InvalidInputError`` naming the problem."""
    messages = body.get("messages")
    if messages is None:
        raise InvalidInputError("request body is missing 'messages'")
    if not isinstance(messages, list) or not messages:
        raise InvalidInputError("'messages' must be a non-empty array")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidInputError(f"messages[{index}] must be an object with a 'role'")
    return messages


def check_scenario_name(name: str) -> str:
    """``name`` if it is a valid scenario name, else ``InvalidInputError``."""
    if not _SCENARIO_RE.fullmatch(name):
        raise InvalidInputError(
            f"invalid scenario name {name!r}: use 1-64 letters, digits, '.', '_' or '-'"
        )
    return name


@dataclass(frozen=True)
class ReefHeaders:
    """Reef's own request headers (DESIGN.md §4)."""

    scenario: str
    session_id: str | None
    release: str | None
    capture: bool
    tags: dict[str, str]
    idempotency_key: str | None
    purpose: Purpose = "serve"


def reef_headers(request: Request, body: dict[str, Any] | None) -> ReefHeaders:
    """Parse Reef's headers; the scenario comes from ``x-reef-scenario``, else a
    ``reef/<scenario>`` model name, else ``default``."""
    # One pass over the raw headers (already lowercase per ASGI) instead of a linear
    # search per lookup: this runs on every inference request.
    headers: dict[str, str] = {}
    for raw_key, raw_value in request.scope["headers"]:
        key = raw_key.decode("latin-1")
        if key.startswith("x-reef-"):
            headers[key] = raw_value.decode("latin-1")
    scenario = headers.get("x-reef-scenario")
    if not scenario and body is not None:
        model = body.get("model")
        if isinstance(model, str) and model.startswith(SCENARIO_MODEL_PREFIX):
            scenario = model[len(SCENARIO_MODEL_PREFIX) :]
    scenario = check_scenario_name(scenario or "default")
    tags = {
        key[len(_TAG_PREFIX) :]: value
        for key, value in headers.items()
        if key.startswith(_TAG_PREFIX) and len(key) > len(_TAG_PREFIX)
    }
    capture = headers.get("x-reef-capture", "on").strip().lower() not in ("off", "0", "false")
    purpose = headers.get("x-reef-purpose", "serve").strip().lower() or "serve"
    if purpose not in _CALLER_PURPOSES:
        raise InvalidInputError(
            f"x-reef-purpose must be one of {', '.join(_CALLER_PURPOSES)}, not {purpose!r}"
        )
    return ReefHeaders(
        scenario=scenario,
        session_id=headers.get("x-reef-session") or None,
        release=headers.get("x-reef-release") or None,
        capture=capture,
        tags=tags,
        idempotency_key=headers.get("x-reef-idempotency-key") or None,
        purpose=cast(Purpose, purpose),
    )

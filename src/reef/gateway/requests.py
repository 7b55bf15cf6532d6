"""Reading what a client sent: the JSON body and query parameters within limits, and
Reef's request headers within theirs.

Every value Reef stores from a header has a limit here (module constants rather than
settings: they bound what one request may write, not how a deployment runs), and
docs/http-api.md lists them; ``tests/gateway/test_header_limits.py`` holds them to it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, Final, cast, overload

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from reef.core.errors import InvalidInputError, NotFoundError
from reef.core.jsoncodec import MAX_DEPTH, deeper_than
from reef.experience import Purpose
from reef.gateway.errors import PayloadTooLargeError, UnsupportedMediaTypeError

SCENARIO_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_SCENARIO_RE = re.compile(SCENARIO_PATTERN)
_TAG_PREFIX = "x-reef-tag-"
RESERVED_TAG_PREFIX = "reef."
# The end user an application key speaks for, kept as this tag: conversation signals
# name it as their author (``reef.learning.computed``).
END_USER_HEADER: Final = "x-reef-end-user"
END_USER_TAG: Final = "end_user"
# What a caller may declare: evaluation traffic is recorded but never trained on.
# ("canary" is set by the gateway itself for the canary arm of live traffic.)
_CALLER_PURPOSES = ("serve", "eval")
SCENARIO_MODEL_PREFIX = "reef/"
_NO_ALIASES: Final[Mapping[str, str]] = MappingProxyType({})

MAX_SESSION_ID_CHARS: Final = 128
# Characters that travel in a URL path segment unencoded, so every session id a client
# may set reads back through GET /reef/scenarios/{s}/sessions/{id}; the first one is a
# letter or digit, so no id is a "." or ".." segment that clients collapse.
SESSION_ID_PATTERN: Final = rf"[A-Za-z0-9][A-Za-z0-9._:@~+=-]{{0,{MAX_SESSION_ID_CHARS - 1}}}"
_SESSION_ID_RE = re.compile(SESSION_ID_PATTERN)
MAX_IDEMPOTENCY_KEY_CHARS: Final = 256  # as the feedback body's idempotency_key
MAX_RELEASE_ID_CHARS: Final = 128
MAX_TAG_NAME_CHARS: Final = 64
MAX_TAG_VALUE_CHARS: Final = 256
MAX_TAGS: Final = 32
# A plain decimal integer small enough for SQLite; int() alone also takes "²", " 5", "+5".
_QUERY_INT_RE = re.compile(r"-?[0-9]{1,19}")
MAX_QUERY_INT: Final = 2**63 - 1


def parse_body(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """``body`` validated as ``model``; raises ``InvalidInputError`` (a 400) naming each
    field that is wrong and why."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInputError(f"invalid request: {problems}") from exc


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
        if exc.msg.startswith("depth limit"):  # orjson's own, far past ours
            raise _too_deep() from exc
        raise InvalidInputError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidInputError("request body must be a JSON object")
    # A body with no more brackets than the limit cannot nest past it: most skip the walk.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and deeper_than(body):
        raise _too_deep()
    return body


_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_SEND_JSON = "send 'Content-Type: application/json'"


def is_json_media_type(content_type: str) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters (``charset``)
    allowed, in any case."""
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def check_media_type(request: Request, takes_body: bool, body_media: tuple[str, ...] = ()) -> None:
    """Refuse (``UnsupportedMediaTypeError``, 415) a write whose body is not declared
    JSON: a route that takes a body needs a JSON ``Content-Type`` (or one of its
    ``body_media``: an upload of JSON Lines); one that takes none accepts no body, or a
    JSON one. Browsers send a cross-site form or ``no-cors`` POST only as ``text/plain``,
    form or multipart media, so none of them reaches a handler."""
    if request.method not in _WRITES:
        return
    headers = request.headers
    content_type = headers.get("content-type")
    if content_type is not None and is_json_media_type(content_type):
        return
    media = (content_type or "").partition(";")[0].strip().lower()
    if media and media in body_media:
        return
    has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
    if content_type is None and not (takes_body or has_body):
        return
    sent = f"{content_type[:80]!r}" if content_type is not None else "none"
    where = f"{request.method} {request.url.path}"
    if body_media:
        fix = f"it takes a JSON Lines body: send 'Content-Type: {body_media[0]}'"
    elif takes_body:
        fix = f"it takes a JSON body: {_SEND_JSON}"
    else:
        fix = f"it takes no body: send none, or {_SEND_JSON}"
    raise UnsupportedMediaTypeError(f"Content-Type {sent} is not accepted on {where}; {fix}")


def _too_deep() -> InvalidInputError:
    return InvalidInputError(
        f"request body nests arrays and objects deeper than {MAX_DEPTH} levels "
        f"(the limit is {MAX_DEPTH})"
    )


def check_scenario_name(name: str) -> str:
    """``name`` if it is a valid scenario name, else ``InvalidInputError``."""
    if not _SCENARIO_RE.fullmatch(name):
        raise InvalidInputError(
            f"invalid scenario name {name[:80]!r}: use 1-64 letters, digits, '.', '_' or '-'"
        )
    return name


class UnknownScenarioError(NotFoundError):
    """An inference request named a scenario that is not configured, and
    ``server.unknown_scenarios`` is ``reject``."""

    def __init__(self, scenario: str, configured: list[str]) -> None:
        listed = ", ".join(repr(name) for name in configured) or "none"
        super().__init__(
            f"scenario {scenario!r} is not configured and server.unknown_scenarios is "
            f"'reject'; configured scenarios: {listed} (name one with model reef/<scenario> "
            "or the x-reef-scenario header, or add it under scenarios: in the configuration)"
        )
        self.scenario = scenario


def check_known_scenario(
    scenario: str,
    configured: Mapping[str, object],
    policy: str,
    visible: Callable[[str], bool] | None = None,
) -> None:
    """Refuse (``UnknownScenarioError``, 404) a ``scenario`` not in ``configured`` when
    ``policy`` is ``reject``; ``default``, where a request naming none lands, always
    passes. ``visible`` (a predicate) limits the names the message lists to those the
    caller's key may use."""
    if policy != "reject" or scenario in configured or scenario == "default":
        return
    names = sorted(name for name in configured if visible is None or visible(name))
    raise UnknownScenarioError(scenario, names)


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


def reef_headers(
    request: Request, body: dict[str, Any] | None, aliases: Mapping[str, str] = _NO_ALIASES
) -> ReefHeaders:
    """Parse Reef's headers; the scenario comes from ``x-reef-scenario``, else a
    ``reef/<scenario>`` model name, else a model name in ``aliases`` (a configured
    ``scenarios.<s>.model_aliases`` entry: the scenario it names), else ``default``.

    Raises ``InvalidInputError`` when ``x-reef-scenario`` names another scenario than
    the model's alias does: one of the two is a mistake, and neither is guessed."""
    # One pass over the raw headers (already lowercase per ASGI) instead of a linear
    # search per lookup: this runs on every inference request.
    headers: dict[str, str] = {}
    for raw_key, raw_value in request.scope["headers"]:
        key = raw_key.decode("latin-1")
        if key.startswith("x-reef-"):
            headers[key] = raw_value.decode("latin-1")
    tags = _tags(headers)
    scenario = headers.get("x-reef-scenario")
    if scenario and not _SCENARIO_RE.fullmatch(scenario):
        raise InvalidInputError(
            f"header x-reef-scenario: invalid scenario name {scenario[:80]!r}: use 1-64 "
            "letters, digits, '.', '_' or '-'"
        )
    model = body.get("model") if body is not None else None
    if isinstance(model, str):
        aliased = aliases.get(model)
        if not scenario:
            if model.startswith(SCENARIO_MODEL_PREFIX):
                scenario = model[len(SCENARIO_MODEL_PREFIX) :]
            else:
                scenario = aliased
        elif aliased is not None and aliased != scenario:
            raise InvalidInputError(
                f"model {model!r} is an alias of scenario {aliased!r} but header "
                f"x-reef-scenario names {scenario[:64]!r}: drop the header to be served "
                f"by {aliased!r}, or name another model"
            )
    scenario = check_scenario_name(scenario or "default")
    capture = headers.get("x-reef-capture", "on").strip().lower() not in ("off", "0", "false")
    purpose = headers.get("x-reef-purpose", "serve").strip().lower() or "serve"
    if purpose not in _CALLER_PURPOSES:
        raise InvalidInputError(
            f"x-reef-purpose must be one of {', '.join(_CALLER_PURPOSES)}, not {purpose[:40]!r}"
        )
    return ReefHeaders(
        scenario=scenario,
        session_id=_session_id(headers.get("x-reef-session") or None),
        release=_bounded(headers, "x-reef-release", MAX_RELEASE_ID_CHARS),
        capture=capture,
        tags=tags,
        idempotency_key=_bounded(headers, "x-reef-idempotency-key", MAX_IDEMPOTENCY_KEY_CHARS),
        purpose=cast(Purpose, purpose),
    )


def _session_id(value: str | None) -> str | None:
    if value is not None:
        _check_length("x-reef-session", value, MAX_SESSION_ID_CHARS)
        if not _SESSION_ID_RE.fullmatch(value):
            raise InvalidInputError(
                "header x-reef-session must be letters, digits and '._:@~+=-', starting "
                f"with a letter or digit (so it reads back by URL), not {value!r}"
            )
    return value


def bounded_header(request: Request, name: str, limit: int) -> str | None:
    """The header ``name`` (None when absent or empty); ``InvalidInputError`` naming it
    and the limit when it is longer than ``limit`` characters."""
    return _bounded(dict(request.headers), name, limit)


def _bounded(headers: dict[str, str], name: str, limit: int) -> str | None:
    value = headers.get(name) or None
    if value is not None:
        _check_length(name, value, limit)
    return value


def _tags(headers: dict[str, str]) -> dict[str, str]:
    """The ``x-reef-tag-<name>`` headers as ``{name: value}``, within their limits."""
    tags = {
        key[len(_TAG_PREFIX) :]: value
        for key, value in headers.items()
        if key.startswith(_TAG_PREFIX) and len(key) > len(_TAG_PREFIX)
    }
    if len(tags) > MAX_TAGS:
        raise InvalidInputError(
            f"{len(tags)} x-reef-tag-* headers sent; the limit is {MAX_TAGS} tags per request"
        )
    for name, value in tags.items():
        if len(name) > MAX_TAG_NAME_CHARS:
            raise InvalidInputError(
                f"header {_TAG_PREFIX}{name[:100]} names a tag of {len(name)} characters; "
                f"the limit is {MAX_TAG_NAME_CHARS} characters"
            )
        _check_length(_TAG_PREFIX + name, value, MAX_TAG_VALUE_CHARS)
        if name.startswith(RESERVED_TAG_PREFIX):
            # Reef's own marks (an imported record's origin and source id): a client
            # that could set them would pass live traffic off as imported history.
            raise InvalidInputError(
                f"header {_TAG_PREFIX}{name[:100]} names a tag Reef reserves (tags starting "
                f"{RESERVED_TAG_PREFIX!r} are set by Reef only); name it otherwise"
            )
    end_user = headers.get(END_USER_HEADER, "").strip()
    if end_user:
        _check_length(END_USER_HEADER, end_user, MAX_TAG_VALUE_CHARS)
        tags[END_USER_TAG] = end_user
    return tags


def _check_length(header: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise InvalidInputError(
            f"header {header} is {len(value)} characters; the limit is {limit} characters"
        )


@overload
def query_int(request: Request, name: str, default: int, lowest: int, highest: int) -> int: ...


@overload
def query_int(
    request: Request, name: str, default: None, lowest: int, highest: int
) -> int | None: ...


def query_int(
    request: Request, name: str, default: int | None, lowest: int, highest: int
) -> int | None:
    """The integer query parameter ``name`` (``default`` when absent); ``InvalidInputError``
    naming it unless it is a plain decimal integer from ``lowest`` to ``highest``."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _QUERY_INT_RE.fullmatch(raw) or not lowest <= int(raw) <= highest:
        raise InvalidInputError(
            f"query parameter {name!r} must be an integer from {lowest} to {highest}, "
            f"not {raw[:40]!r}"
        )
    return int(raw)


def query_number(request: Request, name: str) -> float | None:
    """The finite number query parameter ``name``, or ``None`` when absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InvalidInputError(
            f"query parameter {name!r} must be a finite number, not {raw[:40]!r}"
        )
    return value


# Python's datetimes end at year 1 and 9999; an instant within a day of either end has a
# local reading in some time zone past the end, so a query naming it is refused rather
# than failing (or matching nothing) further in.
_EARLIEST_QUERY_TIME: Final = datetime.min.replace(tzinfo=UTC) + timedelta(days=1)
_LATEST_QUERY_TIME: Final = datetime.max.replace(tzinfo=UTC) - timedelta(days=1)


def query_datetime(request: Request, name: str) -> datetime | None:
    """The ISO 8601 time query parameter ``name`` in UTC (one without an offset is taken
    as UTC), or ``None`` when absent. ``InvalidInputError`` naming it when it is malformed
    or, converted to UTC, out of the range 0001-01-02 to 9999-12-30."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        parsed = datetime.fromisoformat(raw)
        moment = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed
        moment = moment.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise InvalidInputError(
            f"query parameter {name!r} must be an ISO 8601 time such as "
            f"2025-01-31T12:00:00Z, not {raw[:40]!r} ({exc})"
        ) from exc
    if not _EARLIEST_QUERY_TIME <= moment <= _LATEST_QUERY_TIME:
        raise InvalidInputError(
            f"query parameter {name!r} is {moment.isoformat()} in UTC, outside the times "
            f"a record can have ({_EARLIEST_QUERY_TIME:%Y-%m-%d} to "
            f"{_LATEST_QUERY_TIME:%Y-%m-%d})"
        )
    return moment

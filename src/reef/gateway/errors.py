"""Map Reef errors to HTTP status codes and each dialect's error shape, in one place."""

from __future__ import annotations

import logging
from typing import Final, Literal

from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps
from reef.core.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    ReefError,
    UnauthenticatedError,
)
from reef.experience import StoreUnavailableError
from reef.gateway.budgets import SpendRefusedError
from reef.gateway.store_health import StoreHealth
from reef.upstream.base import UpstreamBusyError, UpstreamError
from reef.upstream.sse import encode_sse

log = logging.getLogger("reef.gateway")

ErrorDialect = Literal["openai", "anthropic"]

# When a client may try again after a 503 for a store that cannot be written.
STORE_RETRY_AFTER_SECONDS = 10


class PayloadTooLargeError(InvalidInputError):
    """The request body exceeds ``server.max_body_bytes``."""


class UnsupportedMediaTypeError(InvalidInputError):
    """The request's ``Content-Type`` is not JSON (415): the message names what to send."""


class HostNotAllowedError(InvalidInputError):
    """The request's ``Host`` is not one the gateway answers to (``server.allowed_hosts``)."""


class OriginNotAllowedError(PermissionDeniedError):
    """A browser request from an origin not in ``server.allowed_origins`` (403)."""


class UnsupportedRouteError(InvalidInputError):
    """The scenario's upstream cannot serve this API."""


class InvalidFieldError(InvalidInputError):
    """One field of the request body is wrong; ``param`` names it (``messages[0].content``),
    and OpenAI-shaped errors carry it as ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def status_for(exc: ReefError) -> int:
    """The HTTP status that answers ``exc``."""
    if isinstance(exc, UpstreamError | SpendRefusedError):
        return exc.status
    if isinstance(exc, PayloadTooLargeError):
        return 413
    if isinstance(exc, UnsupportedMediaTypeError):
        return 415
    if isinstance(exc, InvalidInputError):
        return 400
    if isinstance(exc, UnauthenticatedError):
        return 401
    if isinstance(exc, PermissionDeniedError):
        return 403
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, StoreUnavailableError):
        return 503
    return 500


def error_body(status: int, message: str, dialect: ErrorDialect, param: str | None = None) -> bytes:
    """The error document in the caller's dialect (``param``: the body field at fault,
    OpenAI shape only)."""
    if dialect == "anthropic":
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return dumps({"type": "error", "error": {"type": kind, "message": message}})
    kind = _OPENAI_TYPES.get(status, "server_error")
    return dumps({"error": {"message": message, "type": kind, "param": param, "code": status}})


def error_event(exc: UpstreamError, dialect: ErrorDialect) -> bytes:
    """The error a stream ends with when the upstream fails mid-way; its message opens
    with the failure's reason (``upstream_truncated: ...``)."""
    body = error_body(exc.status, exc.detail, dialect)
    return encode_sse(body, "error" if dialect == "anthropic" else None)


def error_response(
    exc: ReefError, dialect: ErrorDialect, headers: dict[str, str] | None = None
) -> Response:
    """An error response for ``exc`` in the caller's dialect."""
    status = status_for(exc)
    out = dict(headers or {})
    if status == 401:
        out.setdefault("www-authenticate", "Bearer")
    if isinstance(exc, StoreUnavailableError):
        out.setdefault("retry-after", str(STORE_RETRY_AFTER_SECONDS))
    if isinstance(exc, UpstreamBusyError):
        out.setdefault("retry-after", str(exc.retry_after_seconds))
    if isinstance(exc, SpendRefusedError):  # a budget (402) or rate limit (429)
        out.setdefault("retry-after", str(exc.retry_after_seconds))
        out.update(exc.headers)
    param = exc.param if isinstance(exc, InvalidFieldError) else None
    return Response(
        error_body(status, exc.message, dialect, param),
        status_code=status,
        media_type="application/json",
        headers=out,
    )


def dialect_of(path: str) -> ErrorDialect:
    """The error dialect of a route: Anthropic's for ``/v1/messages`` (and
    ``/v1/messages/count_tokens``), else OpenAI's."""
    return "anthropic" if path == "/v1/messages" or path.startswith("/v1/messages/") else "openai"


def log_failure(request: Request, exc: ReefError, status: int, health: StoreHealth) -> None:
    """Log a failed request: a store that cannot be written once per episode
    (``health``), any other server-side failure each time (a 501 broke nothing)."""
    if isinstance(exc, StoreUnavailableError):
        health.failed(exc.message)
    elif status >= 500 and status != 501:
        log.error("%s %s failed: %s", request.method, request.url.path, exc.message)


async def reef_error(request: Request, exc: Exception) -> Response:
    """Any ``ReefError`` a route raises, answered in the route's dialect: the one place
    that maps domain errors to HTTP for every route (``status_for``)."""
    assert isinstance(exc, ReefError)
    response = error_response(exc, dialect_of(request.url.path))
    log_failure(request, exc, response.status_code, request.app.state.reef.store_health)
    return response


CLIENT_CLOSED_REQUEST: Final = 499  # nginx's code: the client left; nobody reads it


async def client_gone(request: Request, exc: Exception) -> Response:
    """A client that closed its connection while its request body was read: nothing
    broke on this side, so one info line and no traceback. The answer goes nowhere."""
    log.info(
        "client went away while its request was read: %s %s",
        request.method,
        request.url.path[:200],
    )
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def server_error(request: Request, exc: Exception) -> Response:
    """The 500 for an unexpected error (logged with its traceback), in the OpenAI shape."""
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return Response(
        error_body(500, "internal error in the Reef gateway; see its log", "openai"),
        status_code=500,
        media_type="application/json",
    )

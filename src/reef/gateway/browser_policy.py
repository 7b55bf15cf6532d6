"""What keeps web pages from driving the gateway: the ``Host`` allow-list, the ``Origin``
check, and CORS for the origins an operator allows.

Every HTTP request passes ``BrowserPolicy.admit`` before any route (the inference fast
path included):

- ``Host`` must name the gateway: a loopback name or address, ``server.host``,
  ``evaluation.gateway_url``'s host or a ``server.allowed_hosts`` entry; else 400 naming
  the setting. A DNS-rebinding page reaches the gateway under its own host name, so it is
  refused before it can read anything. Liveness and readiness answer any host (probes
  send the pod's address).
- A request carrying ``Origin`` comes from a browser: its origin must be the gateway's
  own (the dashboard) or in ``server.allowed_origins``; else 403, GET included. A
  browser sends no ``Origin`` on a cross-site ``no-cors`` GET (an ``<img>``): such a
  request (``Sec-Fetch-Site`` cross-site or same-site, not a navigation) is refused too.
- A CORS preflight from an allowed origin gets its answer (204); from any other, 403.
  Actual responses to an allowed cross-origin caller carry ``Access-Control-Allow-Origin``
  and expose Reef's receipt headers. No credentials: keys travel in headers, never
  cookies.
"""

from __future__ import annotations

import ipaddress
import logging
import urllib.parse
from collections.abc import Iterable
from typing import Final

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from reef.config import ReefSettings
from reef.core.errors import ReefError
from reef.gateway.errors import (
    HostNotAllowedError,
    OriginNotAllowedError,
    dialect_of,
    error_response,
)

log = logging.getLogger("reef.gateway")

_WILDCARD_BINDS: Final = frozenset({"", "0.0.0.0", "::", "[::]"})  # noqa: S104 (names, not a bind)
_LOOPBACK_NAMES: Final = frozenset({"localhost"})
_EXPOSED: Final = (
    b"x-reef-record-id, x-reef-agent-record-id, x-reef-release-id, x-reef-session-id, etag"
)
_PREFLIGHT_METHODS: Final = b"GET, POST, DELETE"
_MAX_CACHED_HOSTS: Final = 256
_CROSS_SITE: Final = frozenset({"cross-site", "same-site"})


def host_name(host_header: str) -> str:
    """The name of a ``Host`` header value, lower case, without its port or a trailing
    dot (``[::1]:8600`` → ``::1``)."""
    value = host_header.strip().lower()
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _is_loopback(name: str) -> bool:
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostAllowList:
    """The host names the gateway answers to (see the module docstring)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.exact: set[str] = set()
        self.suffixes: list[str] = []  # ".example.com": any subdomain
        self.any = False
        for name in names:
            if name == "*":
                self.any = True
            elif name.startswith("*."):
                self.suffixes.append(name[1:])
            elif name.startswith("."):
                self.exact.add(name[1:])
                self.suffixes.append(name)
            else:
                self.exact.add(host_name(name))
        self._allowed: set[str] = set()  # Host header values seen and allowed

    @classmethod
    def from_settings(cls, settings: ReefSettings) -> HostAllowList:
        """Loopback, ``server.host`` (unless a wildcard bind), the evaluation gate's
        ``gateway_url`` host and ``server.allowed_hosts``."""
        names = list(settings.server.allowed_hosts)
        bound = (settings.server.host or "").strip().lower()
        if bound not in _WILDCARD_BINDS:
            names.append(bound)
        own = urllib.parse.urlsplit(settings.gateway_url()).hostname
        if own:
            names.append(own)
        return cls(names)

    def allows(self, host_header: str) -> bool:
        """Whether a request with this ``Host`` header value is answered."""
        if self.any or host_header in self._allowed:
            return True
        name = host_name(host_header)
        found = (
            _is_loopback(name)
            or name in self.exact
            or any(name.endswith(suffix) for suffix in self.suffixes)
        )
        if found and len(self._allowed) < _MAX_CACHED_HOSTS:
            self._allowed.add(host_header)
        return found

    def describe(self) -> str:
        """What is allowed, for an error message."""
        named = sorted(self.exact) + [f"*{suffix}" for suffix in sorted(self.suffixes)]
        return ", ".join(["localhost", "127.0.0.1", "[::1]", *named])


class BrowserPolicy:
    """The ``Host``, ``Origin`` and CORS checks of every request (module docstring)."""

    def __init__(
        self, hosts: HostAllowList, origins: Iterable[str], any_host_paths: Iterable[str]
    ) -> None:
        self.hosts = hosts
        self.origins = frozenset(origins)
        self.any_host_paths = frozenset(any_host_paths)

    @classmethod
    def from_settings(cls, settings: ReefSettings, any_host_paths: Iterable[str]) -> BrowserPolicy:
        """The policy that ``server.allowed_hosts`` and ``server.allowed_origins`` set."""
        return cls(
            HostAllowList.from_settings(settings), settings.server.allowed_origins, any_host_paths
        )

    async def admit(self, scope: Scope, receive: Receive, send: Send) -> Send | None:
        """The ``send`` to answer the request with (adding CORS headers for an allowed
        cross-origin caller), or None when the policy has answered it already: a refusal,
        or a preflight."""
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            if name in (b"host", b"origin", b"sec-fetch-site", b"sec-fetch-mode") or (
                name.startswith(b"access-control-request-")
            ):
                headers[name] = value
        try:
            origin = self._check(scope, headers)
        except ReefError as exc:
            refusal = error_response(exc, dialect_of(scope["path"]))
            log_refusal(scope, refusal.status_code, exc.message)
            await refusal(scope, receive, send)
            return None
        if origin is None:
            return send
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            await self._preflight(origin, headers)(scope, receive, send)
            return None
        return _with_cors(send, origin)

    def _check(self, scope: Scope, headers: dict[bytes, bytes]) -> bytes | None:
        """The caller's allowed foreign origin (None for a same-origin or non-browser
        caller); raises ``HostNotAllowedError`` or ``OriginNotAllowedError``."""
        host = headers.get(b"host", b"").decode("latin-1")
        if scope["path"] not in self.any_host_paths and not self.hosts.allows(host):
            raise HostNotAllowedError(
                f"Host {host[:100]!r} is not a name this gateway answers to; add it to "
                f"server.allowed_hosts (allowed now: {self.hosts.describe()}). The check "
                "stops web pages that reach the gateway by DNS rebinding"
            )
        origin = headers.get(b"origin")
        if origin is None:
            site = headers.get(b"sec-fetch-site", b"").decode("latin-1")
            if site in _CROSS_SITE and headers.get(b"sec-fetch-mode") != b"navigate":
                raise OriginNotAllowedError(
                    f"a {site} browser request without an Origin is refused: web pages "
                    "may call this gateway only from server.allowed_origins"
                )
            return None
        text = origin.decode("latin-1").strip().lower().rstrip("/")
        scheme, _, rest = text.partition("://")
        if scheme in ("http", "https") and rest == host.strip().lower():
            return None  # the gateway's own pages: the dashboard
        if text in self.origins:
            return origin
        raise OriginNotAllowedError(
            f"Origin {text[:100]!r} may not call this gateway: add it to "
            "server.allowed_origins to let its pages call the API from a browser"
        )

    def _preflight(self, origin: bytes, headers: dict[bytes, bytes]) -> Response:
        out = {
            "access-control-allow-origin": origin.decode("latin-1"),
            "access-control-allow-methods": _PREFLIGHT_METHODS.decode(),
            "access-control-max-age": "600",
            "vary": "Origin",
        }
        requested = headers.get(b"access-control-request-headers")
        if requested:
            out["access-control-allow-headers"] = requested.decode("latin-1")
        return Response(status_code=204, headers=out)


def log_refusal(scope: Scope, status: int, reason: str) -> None:
    """One warning per request refused as a browser's (what a page tried is worth
    knowing): method, path, status and why."""
    log.warning("refused %s %s (%d): %s", scope["method"], scope["path"][:200], status, reason)


def _with_cors(send: Send, origin: bytes) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {
                **message,
                "headers": [
                    *message.get("headers", ()),
                    (b"access-control-allow-origin", origin),
                    (b"access-control-expose-headers", _EXPOSED),
                    (b"vary", b"Origin"),
                ],
            }
        await send(message)

    return sending

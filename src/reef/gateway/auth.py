"""API-key authentication and the guard that enforces each route's rule.

Keys are kept as sha256 hashes and compared in constant time. ``GuardedEndpoint`` wraps
every route's endpoint (``reef.gateway.routes.build_routes``): it authenticates, checks
the role, the body's media type and a ``{scenario}`` path parameter as the route's rule
says, then hands the handler a ``Grant`` (``grant_of``) through which it checks a
scenario it resolves itself. Handlers never authenticate on their own.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reef.config import ApiKeyConfig
from reef.core.errors import PermissionDeniedError, ReefError, UnauthenticatedError
from reef.gateway.browser_policy import log_refusal
from reef.gateway.errors import dialect_of, error_response
from reef.gateway.requests import check_media_type, check_scenario_name

if TYPE_CHECKING:
    from reef.gateway.routes import RouteRule

log = logging.getLogger("reef.gateway")

Role = Literal["inference", "admin"]


@dataclass(frozen=True)
class Principal:
    """Who sent a request: the key's id (None when auth is off) and what it may do."""

    key_id: str | None
    role: Role
    scenarios: frozenset[str] | None

    def may_use(self, scenario: str) -> bool:
        """Whether this key may use ``scenario``."""
        return self.scenarios is None or scenario in self.scenarios

    def check_scenario(self, scenario: str) -> None:
        """Raise ``PermissionDeniedError`` when this key may not use ``scenario``."""
        if self.scenarios is not None and scenario not in self.scenarios:
            raise PermissionDeniedError(
                f"key {self.key_id!r} may not use scenario {scenario!r}; "
                f"allowed: {sorted(self.scenarios)}"
            )

    def require_admin(self) -> None:
        """Raise ``PermissionDeniedError`` unless this is an admin key."""
        if self.role != "admin":
            raise PermissionDeniedError(f"key {self.key_id!r} is not an admin key")


ANONYMOUS = Principal(key_id=None, role="admin", scenarios=None)
# Who calls a public route: nobody in particular, allowed no scenario.
PUBLIC = Principal(key_id=None, role="inference", scenarios=frozenset())


class Authenticator:
    """Resolves the key presented with a request to a ``Principal``."""

    def __init__(self, keys: list[ApiKeyConfig]) -> None:
        self._keys = [(bytes.fromhex(key.sha256 or ""), key) for key in keys]

    @property
    def enabled(self) -> bool:
        """True when at least one key is configured."""
        return bool(self._keys)

    def authenticate(self, request: Request) -> Principal:
        """The request's principal. Raises ``UnauthenticatedError`` when keys are
        configured and none matches (or none was sent)."""
        if not self._keys:
            return ANONYMOUS
        presented = _presented_key(request)
        if presented is None:
            raise UnauthenticatedError(
                "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
            )
        digest = hashlib.sha256(presented.encode()).digest()
        match: ApiKeyConfig | None = None
        # Compare against every key so timing does not reveal which prefix matched.
        for stored, key in self._keys:
            if hmac.compare_digest(stored, digest):
                match = key
        if match is None:
            raise UnauthenticatedError("invalid API key")
        scenarios = frozenset(match.scenarios) if match.scenarios is not None else None
        return Principal(key_id=match.id, role=match.role, scenarios=scenarios)


def _presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = request.headers.get("x-api-key")
    return key.strip() if key else None


GRANT_SCOPE_KEY: Final = "reef.grant"
# Routes whose handler resolves the scenario: it must check it through the grant.
_HANDLER_CHECKS: Final = frozenset({"request", "resource", "listing"})


class UnguardedRouteError(ReefError):
    """A handler ran without its route's guard (a route added around the table): 500."""


class Grant:
    """What the guard let through for one request: the caller (``principal``), the
    route's rule, and whether the handler has checked the scenario it resolved."""

    __slots__ = ("checked", "principal", "rule")

    def __init__(self, principal: Principal, rule: RouteRule) -> None:
        self.principal = principal
        self.rule = rule
        self.checked = rule.scenario not in _HANDLER_CHECKS

    def check_scenario(self, scenario: str) -> None:
        """Raise ``PermissionDeniedError`` (403) unless the key may use ``scenario``."""
        self.checked = True
        self.principal.check_scenario(scenario)

    def check_resource(self, scenario: str, missing: ReefError) -> None:
        """Raise ``missing`` (the resource's not-found error) unless the key may use
        ``scenario``, the scenario of the resource the request names: another scenario's
        resource is answered like one that does not exist, so ids reveal nothing."""
        self.checked = True
        if not self.principal.may_use(scenario):
            raise missing

    def visible(self, scenario: str) -> bool:
        """Whether a listing shows ``scenario`` (or something of it) to this key."""
        self.checked = True
        return self.principal.may_use(scenario)


def grant_of(request: Request) -> Grant:
    """The grant the route's guard gave this request. Raises ``UnguardedRouteError``
    (500) when no guard ran: a route served around the table fails closed."""
    found = request.scope.get(GRANT_SCOPE_KEY)
    if not isinstance(found, Grant):
        raise UnguardedRouteError(
            f"{request.method} {request.url.path} was served without its access rule "
            "(reef.gateway.routes.ROUTE_TABLE)"
        )
    return found


class GuardedEndpoint:
    """A route's endpoint behind its rule: the one place a request is authenticated and
    its access checked before the handler runs (errors in the route's dialect)."""

    def __init__(self, rule: RouteRule, endpoint: ASGIApp, auth: Authenticator) -> None:
        self.rule = rule
        self.endpoint = endpoint
        self.auth = auth
        self.dialect = dialect_of(rule.path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            grant = self._admit(Request(scope, receive))
        except ReefError as exc:
            refusal = error_response(exc, self.dialect)
            if refusal.status_code == 415:  # what a web page's form or no-cors POST gets
                log_refusal(scope, 415, exc.message)
            await refusal(scope, receive, send)
            return
        scope[GRANT_SCOPE_KEY] = grant
        if not grant.checked and grant.principal.scenarios is not None:
            send = self._unless_unchecked(grant, scope, send)
        await self.endpoint(scope, receive, send)

    def _admit(self, request: Request) -> Grant:
        rule = self.rule
        if rule.access == "public":
            return Grant(PUBLIC, rule)
        principal = self.auth.authenticate(request)
        if rule.access != "inference":
            principal.require_admin()
        check_media_type(request, rule.takes_body, rule.body_media)
        if rule.scenario == "path":
            principal.check_scenario(check_scenario_name(request.path_params["scenario"]))
        elif rule.scenario == "none" and principal.scenarios is not None:
            raise PermissionDeniedError(
                f"key {principal.key_id!r} is limited to scenarios "
                f"{sorted(principal.scenarios)}, and {rule.method} {rule.path} spans every "
                "scenario: use a key without `scenarios`"
            )
        return Grant(principal, rule)

    def _unless_unchecked(self, grant: Grant, scope: Scope, send: Send) -> Send:
        """``send``, except that a success answered to a limited key without a scenario
        check becomes a 500: a handler that forgot its check leaks nothing."""
        refused = False

        async def checked(message: Message) -> None:
            nonlocal refused
            if message["type"] == "http.response.start" and not grant.checked:
                refused = message["status"] < 400
                if refused:
                    log.error("%s %s answered without checking its scenario", *grant.rule.key)
                    failure = error_response(_UNCHECKED, self.dialect)
                    await failure(scope, _no_body, send)
                    return
            if not refused:
                await send(message)

        return checked


_UNCHECKED = UnguardedRouteError(
    "internal error: the route did not check its scenario; see the gateway's log"
)


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}

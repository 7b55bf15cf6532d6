"""The route table: every route of the gateway, who may call it and what body it takes.

``ROUTE_TABLE`` is the one place a route's access is declared. ``build_routes`` turns it
into the app's routes, each endpoint wrapped in a ``GuardedEndpoint`` that enforces its
rule (``reef.gateway.auth``) before the handler runs; the OpenAPI document reads its
access from here too. A route cannot be served without a rule: ``build_routes`` serves
only the table, and ``undeclared_routes`` finds any route added around it (a test runs it
on the app; a handler reached without a guard finds no grant and fails closed).

Access:

- ``public``: no key (health, readiness, the dashboard's files, the API description);
- ``inference``: any valid key; a key limited to scenarios, only for those;
- ``admin-of-scenario``: an admin key allowed the route's scenario;
- ``admin``: an admin key not limited to scenarios (the route spans them all).

Where the scenario comes from (``scenario``): ``path`` (the ``{scenario}`` parameter,
checked by the guard); ``request`` (``x-reef-scenario``, the model or the body, resolved
and checked by the handler: 403 for another scenario); ``resource`` (the scenario of the
record, release, candidate, evaluation, feedback or response the path names, checked by
the handler: another scenario's is a 404, like an unknown id); ``listing`` (the handler
lists only what the key's scenarios may see); ``none`` (no scenario: a limited key is
refused). A handler of a ``request``, ``resource`` or ``listing`` route that answers a
limited key without checking is a bug the guard turns into a 500, never a leak.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, compile_path, request_response
from starlette.types import ASGIApp

from reef.core.errors import ReefError
from reef.gateway.auth import GuardedEndpoint

Access = Literal["public", "inference", "admin-of-scenario", "admin"]
ScenarioFrom = Literal["none", "path", "request", "resource", "listing"]
Handler = Callable[[Request], Awaitable[Response]]


class UndeclaredRouteError(ReefError):
    """A route is served without a rule in ``ROUTE_TABLE`` (or a rule has no handler)."""


@dataclass(frozen=True)
class RouteRule:
    """One method on one path: who may call it (``access``), where its scenario comes
    from, whether it takes a JSON body, and the handler that answers it (``handler``:
    ``"<group>.<method>"`` of the groups ``create_app`` builds)."""

    method: str
    path: str
    access: Access
    scenario: ScenarioFrom
    handler: str
    takes_body: bool = False
    any_host: bool = False  # answered whatever the Host (probes send the pod's address)
    body_media: tuple[str, ...] = ()  # a body of these media types, not JSON (an upload)

    @property
    def key(self) -> tuple[str, str]:
        """``(method, path)`` as Starlette spells them."""
        return self.method, self.path

    @property
    def document_path(self) -> str:
        """The path as OpenAPI writes it (``{model_id:path}`` → ``{model_id}``)."""
        return re.sub(r"{(\w+):\w+}", r"{\1}", self.path)


def _rule(
    method: str,
    path: str,
    access: Access,
    scenario: ScenarioFrom,
    handler: str,
    body_media: tuple[str, ...] = (),
    **flags: bool,
) -> RouteRule:
    return RouteRule(method, path, access, scenario, handler, body_media=body_media, **flags)


_S = "/reef/scenarios/{scenario}"
# What an upload of JSON Lines is declared as (``POST .../import``).
IMPORT_BODY_MEDIA: Final = ("application/x-ndjson", "application/jsonl")

# fmt: off
ROUTE_TABLE: Final[tuple[RouteRule, ...]] = (
    _rule("POST", "/v1/chat/completions", "inference", "request", "inference.openai_chat",
          takes_body=True),
    _rule("POST", "/v1/completions", "inference", "request", "inference.openai_completions",
          takes_body=True),
    _rule("POST", "/v1/embeddings", "inference", "request", "inference.openai_embeddings",
          takes_body=True),
    _rule("POST", "/v1/messages", "inference", "request", "inference.anthropic_messages",
          takes_body=True),
    _rule("POST", "/v1/messages/count_tokens", "inference", "request",
          "token_counts.count_tokens", takes_body=True),
    _rule("POST", "/v1/responses", "inference", "request", "inference.openai_responses",
          takes_body=True),
    _rule("GET", "/v1/responses/{response_id}", "inference", "resource", "responses.get"),
    _rule("DELETE", "/v1/responses/{response_id}", "inference", "resource", "responses.delete"),
    _rule("GET", "/v1/responses/{response_id}/input_items", "inference", "resource",
          "responses.input_items"),
    _rule("GET", "/v1/models", "inference", "listing", "ops.models"),
    _rule("GET", "/v1/models/{model_id:path}", "inference", "listing", "ops.model"),
    _rule("POST", "/reef/feedback", "inference", "request", "feedback.feedback",
          takes_body=True),
    _rule("POST", "/reef/report", "inference", "request", "feedback.report", takes_body=True),
    _rule("POST", "/reef/feedback/{feedback_id}/release", "admin-of-scenario", "resource",
          "feedback.release"),
    _rule("GET", f"{_S}/feedback", "admin-of-scenario", "path", "feedback.list_feedback"),
    _rule("GET", "/reef/records/{record_id}", "admin-of-scenario", "resource", "admin.record"),
    _rule("GET", f"{_S}/records", "admin-of-scenario", "path", "admin.records"),
    _rule("GET", f"{_S}/sessions/{{session_id}}", "admin-of-scenario", "path", "admin.session"),
    _rule("POST", f"{_S}/import", "admin-of-scenario", "path", "importing.upload",
          takes_body=True, body_media=IMPORT_BODY_MEDIA),
    _rule("GET", "/reef/scenarios", "admin-of-scenario", "listing", "chain.scenarios"),
    _rule("DELETE", _S, "admin-of-scenario", "path", "chain.delete_scenario"),
    _rule("GET", f"{_S}/releases", "admin-of-scenario", "path", "chain.releases"),
    _rule("POST", f"{_S}/rollback", "admin-of-scenario", "path", "chain.rollback",
          takes_body=True),
    _rule("POST", f"{_S}/promote", "admin-of-scenario", "path", "chain.promote",
          takes_body=True),
    _rule("POST", f"{_S}/adopt-config", "admin-of-scenario", "path", "chain.adopt_config",
          takes_body=True),
    _rule("POST", f"{_S}/learn", "admin-of-scenario", "path", "chain.learn"),
    _rule("GET", f"{_S}/harness", "inference", "path", "chain.harness"),
    _rule("GET", f"{_S}/harness.tar.gz", "inference", "path", "chain.harness_bundle"),
    _rule("GET", "/reef/releases/{release_id}", "admin-of-scenario", "resource",
          "chain.release"),
    _rule("GET", "/reef/candidates/{candidate_id}", "admin-of-scenario", "resource",
          "chain.candidate"),
    _rule("POST", "/reef/candidates/{candidate_id}/abandon", "admin-of-scenario", "resource",
          "evaluation.abandon", takes_body=True),
    _rule("GET", f"{_S}/candidates", "admin-of-scenario", "path", "evaluation.candidates"),
    _rule("GET", f"{_S}/evaluations", "admin-of-scenario", "path", "evaluation.evaluations_of"),
    _rule("GET", "/reef/evaluations/{evaluation_id}", "admin-of-scenario", "resource",
          "evaluation.evaluation"),
    _rule("GET", "/reef/evaluations/{evaluation_id}/episodes", "admin-of-scenario",
          "resource", "evaluation.episodes"),
    _rule("GET", "/reef/status", "admin-of-scenario", "listing", "chain.status"),
    _rule("GET", f"{_S}/curve", "admin-of-scenario", "path", "insights.curve"),
    _rule("GET", f"{_S}/jobs", "admin-of-scenario", "path", "insights.jobs"),
    _rule("GET", "/reef/costs", "admin-of-scenario", "listing", "insights.costs"),
    _rule("GET", f"{_S}/feedback/calibration", "admin-of-scenario", "path",
          "insights.calibration"),
    _rule("GET", "/reef/artifacts/{digest}/harness", "admin-of-scenario", "resource",
          "insights.harness"),
    _rule("GET", "/ui", "public", "none", "dashboard.root"),
    _rule("GET", "/ui/{path:path}", "public", "none", "dashboard.asset"),
    _rule("GET", "/healthz", "public", "none", "ops.healthz", any_host=True),
    _rule("GET", "/readyz", "public", "none", "ops.readyz", any_host=True),
    _rule("GET", "/metrics", "admin", "none", "ops.metrics"),
    _rule("GET", "/openapi.json", "public", "none", "api_docs.document"),
    _rule("GET", "/docs", "public", "none", "api_docs.page"),
)
# fmt: on

RULES: Final[Mapping[tuple[str, str], RouteRule]] = {rule.key: rule for rule in ROUTE_TABLE}
if len(RULES) != len(ROUTE_TABLE):  # pragma: no cover - a typo in the table
    raise UndeclaredRouteError("ROUTE_TABLE declares a method and path twice")


def _path_patterns() -> dict[str, re.Pattern[str]]:
    return {rule.path: compile_path(rule.path)[0] for rule in ROUTE_TABLE}


_PATH_PATTERNS: Final[Mapping[str, re.Pattern[str]]] = _path_patterns()


def allowed_methods(path: str) -> list[str]:
    """Every method the route table serves on the request path ``path`` (with ``HEAD``
    beside ``GET``, as Starlette answers it), sorted: a 405's ``Allow``. Read from the
    table, so it lists a path's methods even where they are separate routes (``GET`` and
    ``DELETE`` of a stored response); empty for a path the gateway does not serve."""
    methods = {
        rule.method for rule in ROUTE_TABLE if _PATH_PATTERNS[rule.path].match(path) is not None
    }
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def rule_for(method: str, document_path: str) -> RouteRule:
    """The rule of ``method`` on ``document_path`` (OpenAPI's spelling of the path).
    Raises ``UndeclaredRouteError`` when the table has none."""
    for rule in ROUTE_TABLE:
        if rule.method == method.upper() and rule.document_path == document_path:
            return rule
    raise UndeclaredRouteError(
        f"{method.upper()} {document_path} has no rule in reef.gateway.routes.ROUTE_TABLE"
    )


def _handler(groups: Mapping[str, object], name: str) -> object:
    group, _, attribute = name.partition(".")
    found = getattr(groups.get(group), attribute, None)
    if found is None:
        raise UndeclaredRouteError(f"the route table names handler {name!r}, which is not built")
    return found


def build_routes(
    groups: Mapping[str, object], guard: Callable[[RouteRule, ASGIApp], ASGIApp]
) -> tuple[list[BaseRoute], dict[str, ASGIApp]]:
    """The app's routes, one per rule of ``ROUTE_TABLE``, each endpoint (found in
    ``groups`` by the rule's ``handler``) wrapped by ``guard(rule, endpoint)``; and the
    guarded POST endpoints whose handler is an ASGI app (the inference fast path), by
    path. Raises ``UndeclaredRouteError`` for a handler that is not built."""
    routes: list[BaseRoute] = []
    fast: dict[str, ASGIApp] = {}
    for rule in ROUTE_TABLE:
        found = _handler(groups, rule.handler)
        by_request = inspect.iscoroutinefunction(found)  # request -> response, not ASGI
        asgi = request_response(cast(Handler, found)) if by_request else cast(ASGIApp, found)
        guarded = guard(rule, asgi)
        routes.append(Route(rule.path, guarded, methods=[rule.method]))
        if rule.method == "POST" and not by_request:
            fast[rule.path] = guarded
    return routes, fast


def undeclared_routes(app: Starlette) -> list[str]:
    """``METHOD path`` of every route of ``app`` not built from a rule of the table (an
    endpoint that is no guard, or a guard whose rule is not the table's)."""
    found = []
    for route in app.routes:
        if not isinstance(route, Route):
            found.append(f"* {getattr(route, 'path', route)!r}")
            continue
        endpoint = route.app
        rule = endpoint.rule if isinstance(endpoint, GuardedEndpoint) else None
        for method in sorted(route.methods or {"*"}):
            if method == "HEAD":
                continue
            if rule is None or RULES.get((method, route.path)) is not rule:
                found.append(f"{method} {route.path}")
    return found

"""The route table drives access: every route of the table, called by every kind of
caller, is answered as its rule says (401 without a key, 403 for the wrong role or
scenario, 404 for another scenario's resource, anything else when allowed); a route
served around the table is found, and fails closed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Scope

from reef.core.errors import ReefError
from reef.evaluation import EvaluationStore
from reef.gateway.auth import ANONYMOUS, Authenticator, GuardedEndpoint, grant_of
from reef.gateway.errors import status_for
from reef.gateway.routes import ROUTE_TABLE, RouteRule, undeclared_routes
from reef.harness import Bundle, Harness, pack_bundle
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import RawResponse, call

A, B = "alpha", "beta"
# who: (key, role, scenarios); "none" sends no key
CALLERS: dict[str, tuple[str | None, str, frozenset[str] | None]] = {
    "none": (None, "", None),
    "inference-A": ("sk-inference-a", "inference", frozenset({A})),
    "inference-B": ("sk-inference-b", "inference", frozenset({B})),
    "admin-of-A": ("sk-admin-a", "admin", frozenset({A})),
    "admin": ("sk-admin", "admin", None),
}
KEYS = {
    "keys": [
        {"id": "inference-a", "key": "sk-inference-a", "role": "inference", "scenarios": [A]},
        {"id": "inference-b", "key": "sk-inference-b", "role": "inference", "scenarios": [B]},
        {"id": "admin-a", "key": "sk-admin-a", "role": "admin", "scenarios": [A]},
        {"id": "admin", "key": "sk-admin", "role": "admin"},
    ]
}
ADMIN = {"authorization": "Bearer sk-admin"}
INFERENCE_KEY_OF = {A: "sk-inference-a", B: "sk-inference-b"}
CHAT = {"model": f"reef/{A}", "messages": [{"role": "user", "content": "hello"}]}


def expected(rule: RouteRule, who: str, scenario: str) -> str:
    """What the table says ``who`` gets on ``rule`` for a request about ``scenario``:
    ``401``, ``403``, ``404`` (another scenario's resource) or ``allowed``."""
    if rule.access == "public":
        return "allowed"
    key, role, scenarios = CALLERS[who]
    if key is None:
        return "401"
    if rule.access != "inference" and role != "admin":
        return "403"
    if scenarios is None or rule.scenario == "listing":
        return "allowed"
    if rule.scenario == "none":
        return "403"
    if scenario in scenarios:
        return "allowed"
    return "404" if rule.scenario == "resource" else "403"


def outcome(rule: RouteRule, status: int) -> str:
    """How the table's terms read ``status`` on ``rule``."""
    if status in (401, 403):
        return str(status)
    if status == 404 and rule.scenario == "resource":
        return "404"
    return "allowed"


@dataclass
class World:
    """A keyed gateway with one of each resource in each scenario (``ids[scenario]``: by
    path parameter)."""

    gateway: GatewayThread
    ids: dict[str, dict[str, str]]

    def post(self, path: str, body: dict[str, Any], **headers: str) -> RawResponse:
        answer = call(self.gateway.port, "POST", path, body, {**ADMIN, **headers})
        assert answer.status < 300, (path, answer.status, answer.body[:300])
        return answer

    def new_response(self, scenario: str) -> str:
        """A stored response of ``scenario``, created by the scenario's inference key (a
        stored response may belong to the key that wrote it: the matrix then reads it as
        its owner and admins would)."""
        body = {"model": f"reef/{scenario}", "input": "remember this", "store": True}
        owner = {"authorization": f"Bearer {INFERENCE_KEY_OF[scenario]}"}
        return str(self.post("/v1/responses", body, **owner).json()["id"])


def _resources(world: World, scenario: str) -> dict[str, str]:
    ids = {"scenario": scenario, "model_id": f"reef/{scenario}", "path": "app.js"}
    chat = {**CHAT, "model": f"reef/{scenario}"}
    answer = world.post("/v1/chat/completions", chat, **{"x-reef-session": "s-1"})
    ids["record_id"] = answer.headers["x-reef-record-id"]
    ids["session_id"] = "s-1"
    feedback = world.post("/reef/feedback", {"record_ids": [ids["record_id"]], "score": 1})
    ids["feedback_id"] = feedback.json()["id"]
    artifacts = open_artifact_store(world.gateway.settings.artifacts_url())
    prompt = f"Be brief in {scenario}."
    bundle = pack_bundle(Bundle(harness=Harness(schema_version=1, system_prompt=prompt)))
    digest = artifacts.put_bytes(bundle, "harness")
    manifest = ReleaseManifest(
        model=ModelComponent(base="fake-model", adapter=None), harness=digest
    )
    chain = ReleaseChain(world.gateway.database)
    head = chain.create(scenario, manifest, "test", "first")
    candidate = chain.propose(scenario, manifest, head.id, "test", "a candidate")
    evaluations = EvaluationStore(world.gateway.database)
    evaluation = evaluations.start(scenario, candidate.id, head.id, [], {}, "test")
    ids.update(
        release_id=head.id, candidate_id=candidate.id, evaluation_id=evaluation, digest=digest
    )
    ids["response_id"] = world.new_response(scenario)
    return ids


def _world(gateway: GatewayThread) -> World:
    world = World(gateway, {})
    for scenario in (A, B):
        world.ids[scenario] = _resources(world, scenario)
    return world


MODEL = "reef/{scenario}"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": ASK,
    "/v1/completions": {"model": MODEL, "prompt": "hello"},
    "/v1/embeddings": {"model": MODEL, "input": "hello"},
    "/v1/messages": {**ASK, "max_tokens": 16},
    "/v1/messages/count_tokens": ASK,
    "/v1/responses": {"model": MODEL, "input": "hello"},
    "/reef/scenarios/{scenario}/promote": {"candidate_id": "{candidate_id}"},
    "/reef/scenarios/{scenario}/rollback": {"to": "{release_id}"},
    "/reef/candidates/{candidate_id}/abandon": {"reason": "the matrix"},
}


def _request(world: World, rule: RouteRule, scenario: str) -> tuple[str, dict[str, Any] | None]:
    """The concrete path and JSON body of a request about ``scenario`` on ``rule``."""
    ids = dict(world.ids[scenario])
    if rule.path.startswith("/v1/responses/") and rule.method == "DELETE":
        ids["response_id"] = world.new_response(scenario)  # each caller deletes its own
    path = rule.path.replace("{model_id:path}", "{model_id}").replace("{path:path}", "{path}")
    path = path.format(**ids)
    body = BODIES.get(rule.path)
    if rule.path in ("/reef/feedback", "/reef/report"):
        named = "record_ids" if rule.path == "/reef/feedback" else "references"
        body = {named: [ids["record_id"]], "score": 1, "scenario": scenario}
    if body is not None:
        body = {k: v.format(**ids) if isinstance(v, str) else v for k, v in body.items()}
    return path, body


def test_every_route_is_answered_as_the_table_says(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(auth=KEYS, scenarios={A: {"upstream": "fake"}, B: {"upstream": "fake"}})
    app = gateway.app.app
    assert undeclared_routes(app) == []
    routes = [route for route in app.routes if isinstance(route, Route)]
    served = {(method, route.path) for route in routes for method in route.methods or ()}
    assert {rule.key for rule in ROUTE_TABLE} <= served
    world = _world(gateway)
    wrong: list[str] = []
    checked = 0
    for rule in ROUTE_TABLE:
        for who, (key, _, _) in CALLERS.items():
            for scenario in (A, B):
                path, body = _request(world, rule, scenario)
                headers = {"authorization": f"Bearer {key}"} if key else {}
                answer = call(gateway.port, rule.method, path, body, headers)
                got, want = outcome(rule, answer.status), expected(rule, who, scenario)
                checked += 1
                if got != want or answer.status == 500:
                    wrong.append(f"{rule.method} {path} as {who}: {answer.status}, want {want}")
    assert wrong == [], "\n".join(wrong)
    assert checked == len(ROUTE_TABLE) * len(CALLERS) * 2


def test_listings_show_a_limited_key_only_its_scenarios(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(auth=KEYS, scenarios={A: {"upstream": "fake"}, B: {"upstream": "fake"}})
    world = _world(gateway)

    def names(key: str, path: str) -> set[str]:
        answer = call(gateway.port, "GET", path, None, {"authorization": f"Bearer {key}"})
        assert answer.status == 200, answer.body
        return {item.get("name") or item["id"] for item in answer.json()["data"]}

    assert names("sk-admin", "/reef/scenarios") == {A, B}
    assert names("sk-admin-a", "/reef/scenarios") == {A}
    limited = call(
        gateway.port, "GET", "/reef/status", None, {"authorization": "Bearer sk-admin-a"}
    )
    assert set(limited.json()["scenarios"]) == {A}, limited.body
    full = call(gateway.port, "GET", "/reef/status", None, ADMIN).json()
    assert {A, B} <= set(full["scenarios"])
    costs = call(gateway.port, "GET", "/reef/costs", None, {"authorization": "Bearer sk-admin-a"})
    assert {row["scenario"] for row in costs.json()["data"]} == {A}, costs.body
    every = call(gateway.port, "GET", "/reef/costs", None, ADMIN).json()["data"]
    assert {row["scenario"] for row in every} == {A, B}
    assert f"reef/{B}" in names("sk-inference-b", "/v1/models")
    assert f"reef/{A}" not in names("sk-inference-b", "/v1/models")
    # The harness of A's release, by digest: named by A's releases only, to A's admin.
    digest = world.ids[A]["digest"]
    other = call(
        gateway.port, "GET", f"/reef/artifacts/{digest}/harness", None,
        {"authorization": "Bearer sk-admin-a"},
    ).json()  # fmt: skip
    assert {owner["scenario"] for owner in other["named_by"]} == {A}


async def _plain(scope: Scope, receive: Any, send: Any) -> None:
    """An endpoint that answers 200 without checking any scenario."""
    await Response("ok")(scope, receive, send)


def _drive(endpoint: GuardedEndpoint, headers: dict[str, str]) -> int:
    """Call ``endpoint`` as an ASGI server would; the status it answered."""
    sent: list[Message] = []
    scope: Scope = {
        "type": "http",
        "method": "GET",
        "path": "/reef/thing",
        "raw_path": b"/reef/thing",
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "path_params": {},
    }

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(endpoint(scope, receive, send))
    return int(sent[0]["status"])


@pytest.mark.parametrize("scenario_from", ["request", "resource", "listing"])
def test_a_handler_that_forgets_its_scenario_check_answers_500_to_a_limited_key(
    scenario_from: Any,
) -> None:
    from reef.config import ApiKeyConfig

    keys = [ApiKeyConfig.model_validate(key) for key in KEYS["keys"]]
    rule = RouteRule("GET", "/reef/thing", "inference", scenario_from, "test.thing")
    endpoint = GuardedEndpoint(rule, _plain, Authenticator(keys))
    assert _drive(endpoint, {"authorization": "Bearer sk-admin"}) == 200  # unlimited: fine
    assert _drive(endpoint, {"authorization": "Bearer sk-inference-a"}) == 500
    assert _drive(endpoint, {}) == 401


def test_a_route_added_around_the_table_is_found_and_fails_closed(
    gateway: GatewayThread,
) -> None:
    async def sneaky(request: Request) -> Response:
        return Response(str(grant_of(request).principal))

    app = gateway.app.app
    grown = Starlette(routes=[*app.routes, Route("/reef/sneaky", sneaky, methods=["POST"])])
    assert undeclared_routes(grown) == ["POST /reef/sneaky"]
    # A table route whose endpoint was swapped for an unguarded one is found too.
    swapped = Route("/reef/status", sneaky, methods=["GET"])
    assert undeclared_routes(Starlette(routes=[swapped])) == ["GET /reef/status"]
    # Served anyway, its handler finds no grant: a 500, never an open door.
    scope: Scope = {"type": "http", "method": "POST", "path": "/reef/sneaky", "headers": []}
    with pytest.raises(ReefError) as refused:
        grant_of(Request(scope))
    assert status_for(refused.value) == 500
    assert "ROUTE_TABLE" in refused.value.message
    assert ANONYMOUS.role == "admin"  # what a keyless gateway grants: why the guard matters


def test_only_health_docs_and_dashboard_files_are_public() -> None:
    # The matrix follows the table; this pins what the table may leave open.
    public = {rule.key for rule in ROUTE_TABLE if rule.access == "public"}
    assert public == {
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/ui"),
        ("GET", "/ui/{path:path}"),
    }
    for rule in ROUTE_TABLE:
        if rule.path.startswith("/reef/") and rule.access == "inference":
            assert rule.path in (
                "/reef/feedback",
                "/reef/report",
                "/reef/scenarios/{scenario}/harness",
                "/reef/scenarios/{scenario}/harness.tar.gz",
            ), rule
        assert rule.method == "GET" or rule.access != "public", rule

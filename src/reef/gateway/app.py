"""The ASGI application: routes, lifespan, and the process-wide composition."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from reef.config import ReefSettings
from reef.core import dumps
from reef.core.clock import utc_now
from reef.core.errors import NotFoundError, ReefError
from reef.dashboard import DashboardFiles
from reef.db import Database
from reef.evaluation import EvaluationStore
from reef.experience import (
    ExperienceStore,
    IdempotencyClaims,
    RecordWriter,
    Redactor,
    ResponseStore,
)
from reef.gateway.admin.evaluations import EvaluationAdminRoutes
from reef.gateway.admin.experience import AdminRoutes
from reef.gateway.admin.importing import ImportRoutes
from reef.gateway.admin.insights import InsightRoutes
from reef.gateway.admin.releases import ReleaseAdminRoutes
from reef.gateway.auth import Authenticator, GuardedEndpoint, grant_of
from reef.gateway.browser_policy import BrowserPolicy
from reef.gateway.budgets import SpendCollector, SpendControl, open_ledger
from reef.gateway.capture import Recorder
from reef.gateway.errors import (
    client_gone,
    dialect_of,
    error_body,
    reef_error,
    server_error,
)
from reef.gateway.feedback import FeedbackRoutes
from reef.gateway.inference import InferenceRoutes
from reef.gateway.metrics import GatewayMetrics
from reef.gateway.openapi.document import OpenAPIRoutes
from reef.gateway.requests import SCENARIO_MODEL_PREFIX, check_scenario_name
from reef.gateway.responses.stored import ResponsesRoutes
from reef.gateway.routes import ROUTE_TABLE, allowed_methods, build_routes
from reef.gateway.serving.activation import Activation
from reef.gateway.state import GatewayState
from reef.gateway.store_health import StoreHealth
from reef.gateway.token_counts import TokenCountRoutes
from reef.jobs import JobQueue
from reef.releases import ArtifactStore, ReleaseChain, open_artifact_store
from reef.telemetry import open_live_export
from reef.telemetry.attributes import PROVIDERS
from reef.upstream import Upstream, UpstreamError

log = logging.getLogger("reef.gateway")

_READY_TIMEOUT_SECONDS = 3.0
_startup_frozen = False  # once per process: a second app (tests) finds it done


def freeze_startup_objects() -> None:
    """Hide everything alive at start-up (modules, settings, the app itself) from the
    cyclic garbage collector, once per process.

    Under concurrent load the objects of requests in flight survive young collections
    and count toward a full one; a full collection walks every object of the process
    (~60 ms here, a stall for every request in flight), most of them modules that live
    as long as it. Frozen, they are never walked again; what is created later is
    collected as before.
    """
    global _startup_frozen
    if _startup_frozen:
        return
    _startup_frozen = True
    gc.collect()  # start-up garbage goes now rather than frozen forever
    gc.freeze()


def _json(data: Any, status: int = 200) -> Response:
    return Response(dumps(data), status_code=status, media_type="application/json")


class OpsRoutes:
    """Health, readiness, metrics and the model list."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def healthz(self, request: Request) -> Response:
        """``GET /healthz``: the process answers (no auth); with several gateway
        processes, which one answered (``worker``, from 1)."""
        if self.state.worker is None:
            return _json({"status": "ok"})
        return _json({"status": "ok", "worker": self.state.worker})

    async def readyz(self, request: Request) -> Response:
        """``GET /readyz``: the store is writable and every upstream answers (no auth)."""
        checks: dict[str, str] = {"store": await self._store_check()}
        for name, upstream in self.state.upstreams.items():
            try:
                await asyncio.wait_for(upstream.list_models(), _READY_TIMEOUT_SECONDS)
                checks[f"upstream:{name}"] = "ok"
            except (UpstreamError, TimeoutError) as exc:
                checks[f"upstream:{name}"] = str(exc) or type(exc).__name__
        ready = all(value == "ok" for value in checks.values())
        return _json(
            {"status": "ready" if ready else "unavailable", "checks": checks}, 200 if ready else 503
        )

    async def _store_check(self) -> str:
        """The store's check: ``ok``, or why it cannot be written. While writes fail (a
        full disk), a probe write that needs new space decides, so the gateway turns ready
        again without waiting for traffic a load balancer no longer sends it."""
        health = self.state.store_health
        probe = self.state.store.ping if health.problem is None else self.state.store.probe_write
        try:
            await asyncio.to_thread(probe)
        except ReefError as exc:
            if health.problem is not None:
                health.failed(exc.message)  # counted, not logged again
                return f"not writable: {health.problem}"
            return exc.message
        health.succeeded()
        return "ok"

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics`` in Prometheus text format (admin key when keys are set)."""
        return Response(
            self.state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: one ``reef/<scenario>`` entry per configured scenario and
        the scenarios' model aliases, then the models of the upstreams (best effort)."""
        grant = grant_of(request)
        named = {"reef/default": "default"}
        named.update({f"reef/{name}": name for name in self.state.settings.scenarios})
        named.update(self.state.model_aliases)
        named = {n: s for n, s in named.items() if grant.visible(s)}
        names = list(named)
        for upstream in self.state.upstreams.values():
            try:
                names += await asyncio.wait_for(upstream.list_models(), _READY_TIMEOUT_SECONDS)
            except (UpstreamError, TimeoutError):
                log.warning("upstream %s did not list its models", upstream.name)
        data = [_model_card(name) for name in dict.fromkeys(names)]
        return _json({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        """``GET /v1/models/{model_id}``: one model, as ``GET /v1/models`` lists it. A
        ``reef/<scenario>`` of any scenario the key may use, a model alias, or a model an
        upstream lists; anything else is a 404 naming what is served (a scenario the key
        may not use counts as unknown)."""
        grant = grant_of(request)
        model_id: str = request.path_params["model_id"]
        scenario = self.state.model_aliases.get(model_id)
        if scenario is None and model_id.startswith(SCENARIO_MODEL_PREFIX):
            scenario = check_scenario_name(model_id.removeprefix(SCENARIO_MODEL_PREFIX))
        if scenario is not None:
            settings = self.state.settings
            refused = (
                settings.server.unknown_scenarios == "reject"
                and scenario not in settings.scenarios
                and scenario != "default"
            )  # a name inference would answer 404 for is not a model served here
            if grant.visible(scenario) and not refused:
                return _json(_model_card(model_id))
        else:
            grant.checked = True  # an upstream's model belongs to no scenario
            for upstream in self.state.upstreams.values():
                try:
                    served = await asyncio.wait_for(upstream.list_models(), _READY_TIMEOUT_SECONDS)
                except (UpstreamError, TimeoutError):
                    log.warning("upstream %s did not list its models", upstream.name)
                    continue
                if model_id in served:
                    return _json(_model_card(model_id))
        raise NotFoundError(
            f"model {model_id[:200]!r} is not served here: name reef/<scenario>, a "
            "scenario's model alias (scenarios.<s>.model_aliases) or an upstream's model; "
            "GET /v1/models lists them"
        )


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "reef"}


# The API's paths, to tell a path that left out ``/v1`` (a client's base URL without it).
_API_PATHS = [compile_path(rule.path)[0] for rule in ROUTE_TABLE if rule.path.startswith("/v1/")]


def api_path_meant(path: str) -> str | None:
    """``/v1`` + ``path`` when that is a route of the API and ``path`` is not under
    ``/v1`` (``/chat/completions`` → ``/v1/chat/completions``), else None."""
    if path == "/v1" or path.startswith("/v1/"):
        return None
    meant = "/v1" + path.rstrip("/")
    return meant if any(pattern.match(meant) for pattern in _API_PATHS) else None


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    path = request.url.path
    message = f"{exc.detail}: {request.method} {path}"
    meant = api_path_meant(path) if exc.status_code == 404 else None
    if meant is not None:
        base_url = str(request.base_url).rstrip("/") + "/v1"
        message += (
            f"; the API is under /v1: {request.method} {meant} (give clients the base URL "
            f"{base_url})"
        )
    dialect = dialect_of(meant or path)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        # Starlette's Allow names the methods of the first route on the path only; the
        # table knows them all (GET and DELETE of a stored response are two routes).
        allowed = allowed_methods(request.scope["path"])
        if allowed:
            headers["Allow"] = ", ".join(allowed)
    return Response(
        error_body(exc.status_code, message, dialect),
        status_code=exc.status_code,
        media_type="application/json",
        headers=headers,
    )


class InferenceFastPath:
    """Checks every request against the browser policy, then dispatches the inference
    routes straight to their (guarded) ASGI endpoints.

    They carry nearly all traffic; skipping Starlette's middleware stack and route
    matching for them saves measurable CPU per request. Everything else (and the
    lifespan) goes to the Starlette app, which also keeps these routes for
    introspection. The endpoints answer unexpected errors with a 500 in the OpenAI
    shape themselves (``InferenceRoutes.serve``).
    """

    def __init__(self, app: Starlette, routes: dict[str, ASGIApp], policy: BrowserPolicy) -> None:
        self.app = app
        self.routes = routes
        self.policy = policy
        self.state = app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            admitted = await self.policy.admit(scope, receive, send)
            if admitted is None:
                return
            send = admitted
            if scope["method"] == "POST":
                endpoint = self.routes.get(scope["path"])
                if endpoint is not None:
                    await endpoint(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def create_app(
    settings: ReefSettings,
    database: Database,
    store: ExperienceStore,
    upstreams: dict[str, Upstream],
    writer: RecordWriter | None = None,
    artifacts: ArtifactStore | None = None,
) -> InferenceFastPath:
    """Build the gateway on ``database`` (migrated), where ``store`` keeps experience;
    the release chain, stored responses, jobs and evaluations are stores of their own on
    the same database. The app owns ``writer`` and ``upstreams`` once started: its
    lifespan starts the writer and the release activation and, at shutdown, drains
    captures and closes both. The caller closes ``store`` and ``database``."""
    if artifacts is None:
        artifacts = open_artifact_store(settings.artifacts_url())
    activation = Activation(settings, ReleaseChain(database), artifacts, upstreams)
    if writer is None:
        writer = RecordWriter(
            store,
            durability=settings.store.durability,
            queue_size=settings.store.queue_size,
            overflow=settings.store.overflow,
            max_batch=settings.store.max_batch,
        )
    store_health = StoreHealth()
    redactor = Redactor(settings.capture.redact_patterns)
    live = open_live_export(settings.otel)
    recorder = Recorder(store, writer, redactor, store_health)
    if live is not None:
        providers = {
            name: PROVIDERS[upstream.type] for name, upstream in settings.upstreams.items()
        }
        recorder.observer = lambda draft, upstream, pinned: live.record(
            draft, providers.get(upstream, "reef"), pinned
        )
    state = GatewayState(
        settings=settings,
        store=store,
        writer=writer,
        upstreams=upstreams,
        auth=Authenticator(settings.auth.keys),
        metrics=GatewayMetrics(lambda: writer.stats, lambda: activation),
        recorder=recorder,
        activation=activation,
        responses=ResponseStore(database),
        jobs=JobQueue(database),
        evaluations=EvaluationStore(database, redactor),
        spend=SpendControl(settings, open_ledger(settings, database), utc_now),
        database=database,
        claims=IdempotencyClaims(database),
        model_aliases=settings.model_aliases(),
        store_health=store_health,
        live_export=live,
    )
    if live is not None:
        state.metrics.watch_live_export(live)
    state.metrics.registry.register(SpendCollector(state.spend))
    state.metrics.registry.register(state.distill)
    inference = InferenceRoutes(state)
    groups = {
        "inference": inference,
        "feedback": FeedbackRoutes(state),
        "admin": AdminRoutes(state),
        "importing": ImportRoutes(state),
        "ops": OpsRoutes(state),
        "chain": ReleaseAdminRoutes(state),
        "evaluation": EvaluationAdminRoutes(state),
        "insights": InsightRoutes(state),
        "dashboard": DashboardFiles(keys_required=state.auth.enabled),
        "api_docs": OpenAPIRoutes(),
        "responses": ResponsesRoutes(state),
        "token_counts": TokenCountRoutes(state),
    }
    routes, fast_routes = build_routes(
        groups, lambda rule, endpoint: GuardedEndpoint(rule, endpoint, state.auth)
    )
    policy = BrowserPolicy.from_settings(
        settings, [rule.path for rule in ROUTE_TABLE if rule.any_host]
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Streams a gateway was relaying when it died stay ``pending``: settle them.
        settled = await asyncio.to_thread(store.settle_pending, datetime.now(UTC))
        if settled:
            log.warning("%d stream(s) were cut by a gateway stop; recorded as aborted", settled)
        writer.start()
        await activation.start()
        freeze_startup_objects()
        try:
            yield
        finally:
            await inference.shadow.close()
            await activation.stop()
            await recorder.drain()
            await writer.close()
            for upstream in upstreams.values():
                await upstream.aclose()
            if live is not None:  # what is queued goes out, within the export timeout
                await asyncio.to_thread(live.shutdown)

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            HTTPException: _http_error,
            ClientDisconnect: client_gone,
            ReefError: reef_error,
            Exception: server_error,
        },
    )
    app.state.reef = state
    return InferenceFastPath(app, fast_routes, policy)

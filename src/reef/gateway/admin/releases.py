"""Admin routes of the release chain, ``/reef/status``, and the harness download routes."""

from __future__ import annotations

import asyncio
import getpass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps
from reef.core.errors import ConflictError, InvalidInputError, NotFoundError
from reef.environments import tool_isolation
from reef.evaluation import evaluation_holdings
from reef.experience import experience_holdings
from reef.gateway.admin.spend_status import release_and_learning_spend
from reef.gateway.auth import Grant, grant_of
from reef.gateway.requests import (
    MAX_QUERY_INT,
    check_scenario_name,
    parse_body,
    query_int,
    read_json_object,
)
from reef.gateway.serving.drift import adopt_config
from reef.gateway.serving.pins import PinAccess
from reef.gateway.state import GatewayState
from reef.jobs import NoRecipeError, job_holdings
from reef.releases import MAX_PAGE, CandidateNotFoundError, ReleaseNotFoundError

_ACTOR_PREFIX = "api:"


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(data), status_code=status, media_type="application/json", headers=headers)


class RollbackIn(BaseModel):
    """``POST /reef/scenarios/{s}/rollback``."""

    model_config = ConfigDict(extra="forbid")

    to: str = Field(description="The earlier release whose components serve again.")
    expected_head: str | None = Field(
        default=None, description="Refuse (409) unless this is still the head."
    )
    reason: str = Field(default="rollback", max_length=2000)


class PromoteIn(BaseModel):
    """``POST /reef/scenarios/{s}/promote``."""

    model_config = ConfigDict(extra="forbid")

    candidate_id: str
    expected_head: str | None = None
    reason: str = Field(default="promoted after review", max_length=2000)


class AdoptConfigIn(BaseModel):
    """``POST /reef/scenarios/{s}/adopt-config``."""

    model_config = ConfigDict(extra="forbid")

    expected_head: str | None = Field(
        default=None, description="Refuse (409) unless this is still the head."
    )
    reason: str | None = Field(
        default=None,
        max_length=2000,
        description="Why; default: names the model adopted.",
    )


def _visible_status(grant: Grant, status: dict[str, Any]) -> dict[str, Any]:
    """``status`` as ``grant``'s key may see it: a key limited to scenarios sees their
    activation and the adapters and checkpoints loaded for them (named
    ``<scenario>@...``), not another scenario's nor an upstream's in-place weights or
    adapter cache; of
    spend, its scenarios' and its own key's budgets and refusals, not the global ones."""
    grant.checked = True
    if grant.principal.scenarios is None:
        return status

    def own(name: str) -> bool:
        return grant.visible(name.partition("@")[0])

    out = dict(status)
    out["scenarios"] = {k: v for k, v in status["scenarios"].items() if own(k)}
    for pools in ("adapters", "checkpoints"):
        out[pools] = {
            upstream: {name: used for name, used in loaded.items() if own(name)}
            for upstream, loaded in status[pools].items()
        }
    out["in_place"] = {}
    out["distill"] = {k: v for k, v in status["distill"].items() if own(k)}
    out["adapter_cache"] = {}  # names every scenario's adapters
    spend = status["spend"]
    mine = f"key:{grant.principal.key_id}"

    def visible(limit: str) -> bool:
        return limit == mine or (limit.startswith("scenario:") and own(limit[9:]))

    out["spend"] = {
        "budgets": [line for line in spend["budgets"] if visible(line["budget"])],
        "served": [row for row in spend["served"] if own(row["scenario"])],
        "refused": [row for row in spend["refused"] if visible(row["limit"])],
        "releases_since": spend["releases_since"],
        "releases": [row for row in spend["releases"] if own(row["scenario"])],
        "keys": [row for row in spend["keys"] if own(row["scenario"])],
        "learning": [row for row in spend["learning"] if own(row["scenario"])],
        "learning_budgets": [r for r in spend["learning_budgets"] if own(r["scenario"])],
    }
    return out


class ReleaseAdminRoutes:
    """Scenarios, releases, candidates, rollback, promote, adopt-config, status, harness
    downloads."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    def _actor(self, key_id: str | None) -> str:
        return _ACTOR_PREFIX + (key_id or getpass.getuser())

    async def scenarios(self, request: Request) -> Response:
        """``GET /reef/scenarios``: those the key may use, each saying whether the
        configuration names it (``configured``; one that is not was created by a request
        naming it)."""
        grant = grant_of(request)
        summaries = await asyncio.to_thread(self.state.activation.chain.scenarios)
        serving = self.state.activation.serving
        data = []
        grant.checked = True  # a listing of no scenario shows nothing
        for summary in summaries:
            if not grant.visible(summary.name):
                continue
            item = {
                "name": summary.name,
                "head_release_id": summary.head_release_id,
                "head_seq": summary.head_seq,
                "releases": summary.releases,
                "configured": summary.name in self.state.settings.scenarios,
            }
            current = serving.get(summary.name)
            item["serving_release_id"] = current.release_id if current else None
            data.append(item)
        return _json({"data": data})

    async def releases(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/releases?limit=&before_seq=``: newest first."""
        scenario = check_scenario_name(request.path_params["scenario"])
        limit = query_int(request, "limit", 50, 1, MAX_PAGE)
        before_seq = query_int(request, "before_seq", None, 1, MAX_QUERY_INT)
        found = await asyncio.to_thread(
            self.state.activation.chain.releases, scenario, limit, before_seq
        )
        return _json({"data": [release.as_dict() for release in found]})

    async def release(self, request: Request) -> Response:
        """``GET /reef/releases/{release_id}``."""
        release_id = request.path_params["release_id"]
        found = await asyncio.to_thread(self.state.activation.chain.get_release, release_id)
        grant_of(request).check_resource(found.scenario, ReleaseNotFoundError(release_id))
        return _json(found.as_dict())

    async def candidate(self, request: Request) -> Response:
        """``GET /reef/candidates/{candidate_id}``."""
        candidate_id = request.path_params["candidate_id"]
        found = await asyncio.to_thread(self.state.activation.chain.get_candidate, candidate_id)
        grant_of(request).check_resource(found.scenario, CandidateNotFoundError(candidate_id))
        return _json(found.as_dict())

    async def _expected_head(self, scenario: str, given: str | None) -> str:
        if given is not None:
            return given
        head = await asyncio.to_thread(self.state.activation.chain.head, scenario)
        if head is None:
            raise NotFoundError(f"scenario {scenario!r} has no releases")
        return head.id

    async def rollback(self, request: Request) -> Response:
        """``POST /reef/scenarios/{scenario}/rollback`` ``{to, expected_head?, reason?}``."""
        chain = self.state.activation.chain
        principal = grant_of(request).principal
        scenario = check_scenario_name(request.path_params["scenario"])
        body = parse_body(RollbackIn, await read_json_object(request, 1 << 20))
        expected = await self._expected_head(scenario, body.expected_head)
        release = await asyncio.to_thread(
            chain.rollback,
            scenario,
            body.to,
            expected,
            self._actor(principal.key_id),
            body.reason,
        )
        await self.state.activation.sync_once(wait=True, only=scenario)
        return _json(release.as_dict(), status=201)

    async def promote(self, request: Request) -> Response:
        """``POST /reef/scenarios/{scenario}/promote`` ``{candidate_id, expected_head?}``."""
        chain = self.state.activation.chain
        principal = grant_of(request).principal
        scenario = check_scenario_name(request.path_params["scenario"])
        body = parse_body(PromoteIn, await read_json_object(request, 1 << 20))
        candidate = await asyncio.to_thread(chain.get_candidate, body.candidate_id)
        if candidate.scenario != scenario:
            raise InvalidInputError(
                f"candidate {body.candidate_id!r} belongs to scenario "
                f"{candidate.scenario!r}, not {scenario!r}"
            )
        expected = await self._expected_head(scenario, body.expected_head)
        release = await asyncio.to_thread(
            chain.promote,
            body.candidate_id,
            expected,
            self._actor(principal.key_id),
            body.reason,
        )
        await self.state.activation.sync_once(wait=True, only=scenario)
        return _json(release.as_dict(), status=201)

    async def adopt_config(self, request: Request) -> Response:
        """``POST /reef/scenarios/{scenario}/adopt-config`` ``{expected_head?, reason?}``:
        append a release serving the configured model (``reef.gateway.serving.drift``);
        409 when the head already serves it or moved meanwhile."""
        principal = grant_of(request).principal
        scenario = check_scenario_name(request.path_params["scenario"])
        body = parse_body(AdoptConfigIn, await read_json_object(request, 1 << 20))
        release = await asyncio.to_thread(
            adopt_config,
            self.state.activation.chain,
            self.state.settings,
            scenario,
            self._actor(principal.key_id),
            body.reason,
            body.expected_head,
        )
        await self.state.activation.sync_once(wait=True, only=scenario)
        return _json(release.as_dict(), status=201)

    async def learn(self, request: Request) -> Response:
        """``POST /reef/scenarios/{scenario}/learn``: queue a manual learning job (a
        running or queued job of the scenario is returned instead of a second one)."""
        principal = grant_of(request).principal
        scenario = check_scenario_name(request.path_params["scenario"])
        if self.state.settings.scenario(scenario).recipe is None:
            raise NoRecipeError(scenario, " and restart the gateway and worker")
        queue = self.state.jobs
        job = await asyncio.to_thread(
            queue.enqueue,
            scenario,
            "learn",
            {"trigger": "manual", "requested_by": self._actor(principal.key_id)},
        )
        return _json(job.as_dict(), status=202)

    async def delete_scenario(self, request: Request) -> Response:
        """``DELETE /reef/scenarios/{scenario}``: delete a scenario the configuration does
        not name and that holds nothing (``ReleaseChain.forget_scenario``); 409 naming
        what it holds otherwise, since deleting would drop experience."""
        scenario = check_scenario_name(request.path_params["scenario"])
        if scenario in self.state.settings.scenarios:
            raise ConflictError(
                f"scenario {scenario!r} is configured (scenarios.{scenario}); remove it from "
                "the configuration and restart before deleting it"
            )
        others = (experience_holdings, job_holdings, evaluation_holdings)
        await asyncio.to_thread(self.state.activation.chain.forget_scenario, scenario, others)
        self.state.activation.forget(scenario)
        return _json({"name": scenario, "deleted": True})

    async def status(self, request: Request) -> Response:
        """``GET /reef/status``: activation per scenario, adapters, capture queue, and the
        OS boundary the python environment's tools get here (of the key's scenarios, for a
        key limited to some)."""
        stats = self.state.writer.stats
        boundary = await asyncio.to_thread(tool_isolation)  # probed once per process
        return _json(
            _visible_status(
                grant_of(request),
                {
                    **self.state.activation.status_json(),
                    "capture": {
                        "durability": self.state.settings.store.durability,
                        "queue_depth": stats.queue_depth,
                        "written_total": stats.written_total,
                        "dropped_total": stats.dropped_total,
                        "failed_total": stats.failed_total,
                    },
                    "tool_isolation": boundary.as_dict(),
                    "spend": {
                        **await self.state.spend.status_json(),
                        **await asyncio.to_thread(
                            release_and_learning_spend, self.state, self.state.spend.clock()
                        ),
                    },
                    "distill": self.state.distill.status_json(),
                },
            )
        )

    async def harness(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/harness``: the serving harness as JSON, with
        ``ETag`` = its bundle digest and ``x-reef-release-id``."""
        serving, principal_ok = await self._serving_with_harness(request)
        del principal_ok
        assert serving.harness is not None and serving.bundle_digest is not None
        etag = f'"{serving.bundle_digest}"'
        headers = {"etag": etag, "x-reef-release-id": serving.release_id or "none"}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return _json(
            {
                "scenario": serving.scenario,
                "release_id": serving.release_id,
                "digest": serving.bundle_digest,
                "artifact": serving.harness_digest,
                "harness": serving.harness.model_dump(mode="json"),
            },
            headers=headers,
        )

    async def harness_bundle(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/harness.tar.gz``: the bundle to install."""
        serving, _ = await self._serving_with_harness(request)
        assert serving.harness_digest is not None
        data = await asyncio.to_thread(
            self.state.activation.artifacts.read_bytes, serving.harness_digest
        )
        return Response(
            data,
            media_type="application/gzip",
            headers={
                "etag": f'"{serving.bundle_digest}"',
                "x-reef-release-id": serving.release_id or "none",
                "content-disposition": f'attachment; filename="{serving.scenario}-harness.tar.gz"',
            },
        )

    async def _serving_with_harness(self, request: Request) -> tuple[Any, bool]:
        principal = grant_of(request).principal
        scenario = check_scenario_name(request.path_params["scenario"])
        release = request.headers.get("x-reef-release") or request.query_params.get("release")
        activation = self.state.activation
        if release:
            # A candidate's harness is the admin's alone: the gate's key reads none here.
            access: PinAccess = "admin" if principal.role == "admin" else "inference"
            serving = (await activation.pinned(scenario, release, principal, access)).serving
        else:
            serving = await activation.current(scenario)
        if serving.harness is None:
            raise NotFoundError(f"release {serving.release_id!r} of {scenario!r} has no harness")
        return serving, True

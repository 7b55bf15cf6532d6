"""Admin routes of candidates and the evaluation gate's runs (read-only, admin key).

- ``GET /reef/scenarios/{s}/candidates?state=&limit=``: candidates newest first;
- ``GET /reef/scenarios/{s}/evaluations?limit=``: evaluations newest first;
- ``GET /reef/evaluations/{id}``: one evaluation with its per-item results, its
  episodes (``gate.episodes``: without their conversations) and, with ``?items=1``, the
  items it asked;
- ``GET /reef/evaluations/{id}/episodes?task=``: its episodes with their conversations
  (of one task, both sides, when ``task`` is given);
- ``POST /reef/candidates/{id}/abandon``: stop a pending, passed or canary candidate
  (``{"reason": ...}``); a canary's live traffic returns to the head.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps
from reef.core.errors import InvalidInputError, NotFoundError
from reef.gateway.auth import grant_of
from reef.gateway.requests import check_scenario_name, parse_body, query_int, read_json_object
from reef.gateway.state import GatewayState

# EvaluationStore.list takes as many as the chain's MAX_PAGE
from reef.releases import CANDIDATE_STATES, MAX_PAGE, CandidateNotFoundError, CandidateState


def _json(data: Any, status: int = 200) -> Response:
    return Response(dumps(data), status_code=status, media_type="application/json")


def _limit(request: Request, default: int = 50) -> int:
    return query_int(request, "limit", default, 1, MAX_PAGE)


class AbandonIn(BaseModel):
    """``POST /reef/candidates/{id}/abandon``."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="abandoned by an operator", max_length=2000)


class EvaluationAdminRoutes:
    """Candidates and evaluations for operators and the dashboard."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.evaluations = state.evaluations

    async def candidates(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/candidates``."""
        scenario = check_scenario_name(request.path_params["scenario"])
        raw = request.query_params.get("state")
        if raw is not None and raw not in CANDIDATE_STATES:
            raise InvalidInputError(
                f"state must be one of {', '.join(CANDIDATE_STATES)}, not {raw!r}"
            )
        state: CandidateState | None = raw
        found = await asyncio.to_thread(
            self.state.activation.chain.candidates, scenario, state, _limit(request)
        )
        return _json({"data": [candidate.as_dict() for candidate in found]})

    async def evaluations_of(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/evaluations``."""
        scenario = check_scenario_name(request.path_params["scenario"])
        found = await asyncio.to_thread(self.evaluations.list, scenario, None, _limit(request))
        return _json({"data": [evaluation.as_dict() for evaluation in found]})

    async def evaluation(self, request: Request) -> Response:
        """``GET /reef/evaluations/{evaluation_id}``."""
        evaluation_id = request.path_params["evaluation_id"]
        found = await self._evaluation(request, evaluation_id)
        results = await asyncio.to_thread(self.evaluations.results, evaluation_id)
        data = found.as_dict()
        data["results"] = [result.as_dict() for result in results]
        episodes = await asyncio.to_thread(self.evaluations.episodes, evaluation_id)
        data["episodes"] = [episode.as_dict(messages=False) for episode in episodes]
        if request.query_params.get("items") in ("1", "true"):
            items = await asyncio.to_thread(self.evaluations.items, evaluation_id)
            data["items"] = [item.as_dict() for item in items]
        return _json(data)

    async def episodes(self, request: Request) -> Response:
        """``GET /reef/evaluations/{evaluation_id}/episodes?task=``."""
        evaluation_id = request.path_params["evaluation_id"]
        await self._evaluation(request, evaluation_id)  # 404 when unknown
        task = request.query_params.get("task")
        found = await asyncio.to_thread(self.evaluations.episodes, evaluation_id, task)
        return _json({"data": [episode.as_dict() for episode in found]})

    async def _evaluation(self, request: Request, evaluation_id: str) -> Any:
        """The evaluation, when the key may use its scenario (else a 404 like an unknown
        id)."""
        found = await asyncio.to_thread(self.evaluations.get, evaluation_id)
        missing = NotFoundError(f"evaluation {evaluation_id!r} not found")
        grant_of(request).check_resource(found.scenario, missing)
        return found

    async def abandon(self, request: Request) -> Response:
        """``POST /reef/candidates/{candidate_id}/abandon``."""
        grant = grant_of(request)
        principal = grant.principal
        body = await read_json_object(request, self.state.settings.server.max_body_bytes)
        parsed: AbandonIn = parse_body(AbandonIn, body)
        chain = self.state.activation.chain
        candidate_id = request.path_params["candidate_id"]
        current = await asyncio.to_thread(chain.get_candidate, candidate_id)
        grant.check_resource(current.scenario, CandidateNotFoundError(candidate_id))
        evidence = {
            **(current.evidence or {}),
            "abandoned": {"by": f"api:{principal.key_id}", "reason": parsed.reason},
        }
        found = await asyncio.to_thread(
            chain.set_candidate_state, candidate_id, "abandoned", evidence
        )
        return _json(found.as_dict())

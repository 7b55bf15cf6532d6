"""Admin reads of experience: records, a scenario's records, sessions."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps
from reef.core.errors import InvalidInputError
from reef.experience import (
    IMPORT_FORMATS,
    IMPORT_ORIGIN_PREFIX,
    RecordFilter,
    RecordNotFoundError,
    RecordView,
    assemble_trajectory,
)
from reef.gateway.auth import grant_of
from reef.gateway.requests import check_scenario_name, query_datetime, query_int, query_number
from reef.gateway.state import GatewayState

MAX_RECORDS_PAGE = 500


def record_json(view: RecordView) -> dict[str, Any]:
    """A record as the admin API returns it."""
    return dataclasses.asdict(view)


def _json(data: Any, status: int = 200) -> Response:
    return Response(dumps(data), status_code=status, media_type="application/json")


def _parse_bool(name: str, value: str | None) -> bool | None:
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise InvalidInputError(f"query parameter {name!r} must be true or false, not {value!r}")


def record_origins() -> list[str]:
    """The values of the records listing's ``origin`` filter: ``live`` (traffic through
    the gateway) and ``import:<format>`` for each import format."""
    return ["live", *(IMPORT_ORIGIN_PREFIX + name for name in IMPORT_FORMATS)]


def _origin(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if value not in record_origins():
        raise InvalidInputError(
            f"query parameter 'origin' must be one of {', '.join(record_origins())}, "
            f"not {value[:80]!r}"
        )
    return value


def _parse_filters(request: Request) -> tuple[RecordFilter, str | None, int]:
    query = request.query_params
    limit = query_int(request, "limit", 50, 1, MAX_RECORDS_PAGE)
    since = query_datetime(request, "since")
    filters = RecordFilter(
        session_id=query.get("session"),
        has_feedback=_parse_bool("has_feedback", query.get("has_feedback")),
        min_score=query_number(request, "min_score"),
        since=since,
        origin=_origin(query.get("origin")),
    )
    return filters, query.get("cursor"), limit


class AdminRoutes:
    """Read-only experience routes (access: ``reef.gateway.routes``)."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def record(self, request: Request) -> Response:
        """``GET /reef/records/{record_id}``: one record with its feedback."""
        record_id = request.path_params["record_id"]
        view = await asyncio.to_thread(self.state.store.get_record, record_id)
        grant_of(request).check_resource(view.scenario, RecordNotFoundError(record_id))
        return _json(record_json(view))

    async def records(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/records``: newest first, cursor-paginated."""
        scenario = check_scenario_name(request.path_params["scenario"])
        filters, cursor, limit = _parse_filters(request)
        page = await asyncio.to_thread(
            self.state.store.list_records, scenario, filters, cursor, limit
        )
        return _json(
            {
                "data": [record_json(view) for view in page.records],
                "next_cursor": page.next_cursor,
            }
        )

    async def session(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/sessions/{session_id}``: the session's records
        in turn order (``turns``) and its trajectory tree (``trajectory``, see
        ``reef.experience.trajectories``)."""
        scenario = check_scenario_name(request.path_params["scenario"])
        session_id = request.path_params["session_id"]
        store = self.state.store
        views = await asyncio.to_thread(store.get_session, scenario, session_id)
        outcomes = await asyncio.to_thread(store.session_feedback, scenario, session_id)
        trajectory = assemble_trajectory(scenario, session_id, views, outcomes)
        return _json(
            {
                "session_id": session_id,
                "scenario": scenario,
                "turns": [record_json(view) for view in views],
                "trajectory": trajectory.as_dict(),
            }
        )

"""The stored side of the OpenAI Responses API: keeping answered responses, and
``GET``/``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``.

``POST /v1/responses`` itself is an inference route (``reef.gateway.inference``). A
response is kept only when its exchange is captured and the request did not say
``store: false`` (``x-reef-capture: off`` persists nothing: ``resolve_turn``); it is
kept redacted, as its record is. It is read back and deleted by the key that created it
or an admin key (``reef.gateway.responses.owners``). A response of another key, of a
scenario the key may not use, or of another scenario than ``x-reef-scenario`` names, is
a 404 like an unknown id: ids of others are not confirmed.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps
from reef.core.errors import InvalidInputError
from reef.experience import Redactor, StoredResponse
from reef.gateway.auth import grant_of
from reef.gateway.capture import Exchange
from reef.gateway.requests import check_scenario_name, query_int
from reef.gateway.responses.owners import check_owner
from reef.gateway.state import GatewayState

MAX_ITEMS_PAGE: Final = 100
_KEPT_STATUSES: Final = ("completed", "incomplete")


def response_to_keep(
    exchange: Exchange, response: dict[str, Any], redactor: Redactor
) -> StoredResponse | None:
    """What of ``response`` (the answer of ``exchange``) is kept for later turns, with
    its input and output redacted: None unless it is a captured Responses exchange that
    finished and did not say ``store: false``. It travels with the exchange's record
    (``RecordDraft.kept_response``), one transaction for both."""
    turn = exchange.responses
    if turn is None or not turn.store or not exchange.capture:
        return None
    if response.get("status") not in _KEPT_STATUSES:
        return None
    return redactor.redact_stored_response(
        StoredResponse(
            id=turn.response_id,
            scenario=exchange.scenario,
            session_id=exchange.session_id,
            record_id=exchange.record_id,
            previous_response_id=turn.previous.id if turn.previous is not None else None,
            principal=exchange.principal.key_id,
            input_items=turn.items,
            response=response,
        )
    )


class ResponsesRoutes:
    """Reads and deletes of stored responses (OpenAI error shape)."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def _stored(self, request: Request) -> StoredResponse:
        grant = grant_of(request)
        response_id = request.path_params["response_id"]
        named = request.headers.get("x-reef-scenario")
        scenario = check_scenario_name(named) if named else None
        stored = await asyncio.to_thread(self.state.responses.get, response_id, scenario)
        grant.checked = True  # check_owner checks the key's scenarios too
        check_owner(grant.principal, stored, scenario)
        return stored

    async def get(self, request: Request) -> Response:
        """``GET /v1/responses/{response_id}``: the response as it was answered."""
        stored = await self._stored(request)
        return _json(stored.response)

    async def delete(self, request: Request) -> Response:
        """``DELETE /v1/responses/{response_id}``: forget it (its record stays)."""
        stored = await self._stored(request)
        await asyncio.to_thread(self.state.responses.delete, stored.id, stored.scenario)
        return _json({"id": stored.id, "object": "response", "deleted": True})

    async def input_items(self, request: Request) -> Response:
        """``GET /v1/responses/{response_id}/input_items``: the items the response
        answered (earlier turns included), ``order`` ``desc`` (default) or ``asc``,
        ``limit`` 1-100 (20), paged by item id with ``after`` / ``before``."""
        stored = await self._stored(request)
        page = _page(request, stored.input_items)
        return _json(page)


def _page(request: Request, items: list[dict[str, Any]]) -> dict[str, Any]:
    limit = query_int(request, "limit", 20, 1, MAX_ITEMS_PAGE)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidInputError(f"query parameter 'order' must be asc or desc, not {order[:40]!r}")
    ordered = items if order == "asc" else items[::-1]
    ids = [item.get("id") for item in ordered]
    start, end = 0, len(ordered)
    for name in ("after", "before"):
        cursor = request.query_params.get(name)
        if cursor is None:
            continue
        if cursor not in ids:
            raise InvalidInputError(f"query parameter {name!r} names no item of this response")
        if name == "after":
            start = ids.index(cursor) + 1
        else:
            end = ids.index(cursor)
    window = ordered[start:end]
    data = window[:limit] if request.query_params.get("before") is None else window[-limit:]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].get("id") if data else None,
        "last_id": data[-1].get("id") if data else None,
        "has_more": len(window) > len(data),
    }


def _json(data: Any) -> Response:
    return Response(dumps(data), media_type="application/json")

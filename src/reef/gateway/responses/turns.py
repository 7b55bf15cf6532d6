"""One Responses API request made ready for a chat-completions upstream: the
conversation it continues resolved, its record's request, its chat request and the
response object it will fill."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Final

from reef.experience import ResponseStore, StoredResponse
from reef.gateway.auth import Principal
from reef.gateway.errors import InvalidFieldError
from reef.gateway.responses.owners import check_owner
from reef.upstream import (
    input_items,
    item_id,
    response_id_for,
    response_shell,
    responses_request_to_openai,
)

_ITEM_ID_PREFIXES: Final = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


@dataclass(frozen=True)
class ResponsesTurn:
    """A Responses request resolved.

    ``body`` is what the record keeps as the request: the client's body, with ``input``
    the whole conversation when ``previous_response_id`` named one (the stored items,
    then the items sent), so a record reads alone like a chat-completions one. ``chat``
    is the chat-completions request (without a model yet), ``shell`` the response
    object before any output, ``items`` everything the response answers, each item
    with an id (what ``input_items`` lists).
    """

    response_id: str
    body: dict[str, Any]
    chat: dict[str, Any]
    shell: dict[str, Any]
    items: list[dict[str, Any]]
    previous: StoredResponse | None
    store: bool


@dataclass(frozen=True)
class TurnContext:
    """Who sends a Responses request, and whether its exchange is captured."""

    scenario: str
    principal: Principal
    capture: bool


async def resolve_turn(
    responses: ResponseStore, context: TurnContext, body: dict[str, Any], record_id: str
) -> ResponsesTurn:
    """The turn of a checked Responses ``body`` in ``context.scenario``.

    Raises ``ResponseNotFoundError`` when ``previous_response_id`` names no stored
    response of the scenario that the principal may use (its own, or any for an admin
    key), and ``InvalidFieldError`` for ``store: true`` on an exchange that is not
    captured: capture off persists nothing, Responses state included. Without ``store``
    such a turn is not kept (it answers ``store: false``).
    """
    scenario = context.scenario
    if not context.capture:
        if body.get("store") is True:
            raise InvalidFieldError(
                "store",
                "'store': true cannot be honoured: capture is off for this request "
                f"(x-reef-capture: off, or scenarios.{scenario}.capture: false), and "
                "Reef then persists nothing, stored responses included; send store: "
                "false (or leave it out) and pass the history yourself, or turn capture on",
            )
        body = {**body, "store": False}
    previous: StoredResponse | None = None
    previous_id = body.get("previous_response_id")
    sent = input_items(body)
    history: list[dict[str, Any]] = []
    if isinstance(previous_id, str):
        previous = await asyncio.to_thread(responses.get, previous_id, scenario)
        check_owner(context.principal, previous, scenario)
        history = previous.conversation()
        body = {**body, "input": [*history, *sent]}
    model = body.get("model")
    client_model = model if isinstance(model, str) and model else "reef/" + scenario
    response_id = response_id_for(record_id)
    return ResponsesTurn(
        response_id=response_id,
        body=body,
        chat=responses_request_to_openai(body, model=""),
        shell=response_shell(body, response_id, client_model, int(time.time())),
        items=[*history, *(_listed(item) for item in sent)],
        previous=previous,
        store=body.get("store") is not False,
    )


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` as ``input_items`` lists it: with an id, a message's text as a part."""
    out = dict(item)
    if not out.get("id"):
        out["id"] = item_id(_ITEM_ID_PREFIXES.get(out.get("type", ""), "item"))
    if out.get("type") == "message" and isinstance(out.get("content"), str):
        kind = "output_text" if out.get("role") == "assistant" else "input_text"
        out["content"] = [{"type": kind, "text": out["content"]}]
        out.setdefault("status", "completed")
    return out

"""``POST /reef/feedback`` and ``POST /reef/report``: scores, text and corrections."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps
from reef.core.errors import InvalidInputError, ReefError
from reef.experience import FeedbackDraft
from reef.gateway.errors import error_response
from reef.gateway.requests import check_scenario_name, read_json_object
from reef.gateway.state import GatewayState


class FeedbackIn(BaseModel):
    """The body of ``POST /reef/feedback`` (schema version 1)."""

    model_config = ConfigDict(extra="forbid")

    record_ids: list[str] = Field(min_length=1, description="Records this feedback is about.")
    score: float | None = Field(default=None, allow_inf_nan=False)
    feedback: Any = Field(default=None, description="Free text or structured feedback.")
    correction: Any = Field(default=None, description="What the answer should have been.")
    idempotency_key: str | None = Field(default=None, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict)
    scenario: str | None = Field(
        default=None, description="Defaults to x-reef-scenario, else the first record's."
    )


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "body"
        if error["type"] == "extra_forbidden":
            parts.append(f"unknown field {where!r}")
        else:
            parts.append(f"{where}: {error['msg']}")
    return "invalid feedback: " + "; ".join(parts)


class FeedbackRoutes:
    """Stores feedback after checking the caller may touch the records' scenario."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def feedback(self, request: Request) -> Response:
        """``POST /reef/feedback``."""
        return await self._receive(request, ids_field="record_ids")

    async def report(self, request: Request) -> Response:
        """``POST /reef/report``: the same, with ``references`` naming the records."""
        return await self._receive(request, ids_field="references")

    async def _receive(self, request: Request, ids_field: str) -> Response:
        try:
            principal = self.state.auth.authenticate(request)
            body = await read_json_object(request, self.state.settings.server.max_body_bytes)
            if ids_field != "record_ids":
                if "record_ids" in body:
                    raise InvalidInputError(f"use {ids_field!r} (not 'record_ids') on this route")
                body["record_ids"] = body.pop(ids_field, None)
            try:
                parsed = FeedbackIn.model_validate(body)
            except ValidationError as exc:
                message = _validation_message(exc).replace("record_ids", ids_field)
                raise InvalidInputError(message) from exc
            key = parsed.idempotency_key or request.headers.get("x-reef-idempotency-key")
            scenario = parsed.scenario or request.headers.get("x-reef-scenario")
            store = self.state.store
            if self.state.settings.store.durability == "async":
                # The records may still be queued; feedback must be able to name them.
                await self.state.writer.flush()
            if scenario is None:
                first = await asyncio.to_thread(store.get_record, parsed.record_ids[0])
                scenario = first.scenario
            check_scenario_name(scenario)
            principal.check_scenario(scenario)
            draft = FeedbackDraft(
                scenario=scenario,
                record_ids=tuple(parsed.record_ids),
                score=parsed.score,
                feedback=parsed.feedback,
                correction=parsed.correction,
                metadata=parsed.metadata,
                principal=principal.key_id,
                idempotency_key=key,
            )
            feedback_id, created = await asyncio.to_thread(store.add_feedback, draft)
        except ReefError as exc:
            return error_response(exc, "openai")
        if created:
            self.state.metrics.feedback_written.inc()
        return Response(
            dumps({"id": feedback_id, "created": created, "record_ids": parsed.record_ids}),
            status_code=201 if created else 200,
            media_type="application/json",
        )

"""``POST /reef/feedback`` and ``POST /reef/report``: scores, text and corrections."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps
from reef.core.errors import InvalidInputError
from reef.core.validation import problem_lines
from reef.experience import (
    FeedbackDraft,
    FeedbackNotFoundError,
    RecordNotFoundError,
    check_correction,
)
from reef.gateway.auth import Grant, grant_of
from reef.gateway.requests import (
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_SESSION_ID_CHARS,
    SCENARIO_PATTERN,
    bounded_header,
    check_scenario_name,
    query_int,
    read_json_object,
)
from reef.gateway.state import GatewayState


class FeedbackIn(BaseModel):
    """The body of ``POST /reef/feedback`` (schema version 1): about records, or the
    outcome of a session's task (``session_id``), or both (one record: the turn targeted)."""

    # What it must be about (``_check_targets``) is stated in the OpenAPI document by
    # ``reef.gateway.openapi.document``, for this body and ``/reef/report``'s alike.
    model_config = ConfigDict(extra="forbid")

    record_ids: list[str] = Field(
        default_factory=list,
        description="Records this feedback is about. With `session_id`: at most one, the "
        "turn it targets (a correction of that turn).",
    )
    session_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SESSION_ID_CHARS,
        description="The session whose task outcome this is; the recipe's credit policy "
        "spreads the score over the turns of its branch.",
    )
    score: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="Within the scenario's `scenarios.<s>.score_range` (default [0, 1]); "
        "outside it is a 400.",
    )
    feedback: Any = Field(default=None, description="Free text or structured feedback.")
    correction: Any = Field(
        default=None,
        description="What the answer should have been: text, or "
        '`{"tool_calls": [{"type": "function", "function": {"name", "arguments"}}], '
        '"content"?}` when the turn should have called tools.',
    )
    idempotency_key: str | None = Field(default=None, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict)
    scenario: str | None = Field(
        default=None,
        description="Defaults to x-reef-scenario, else the first record's (empty: the same).",
        # Checked by the route (``check_scenario_name``); stated here for the document.
        json_schema_extra={"maxLength": 64, "pattern": f"^(?:{SCENARIO_PATTERN})?$"},
    )


def _validation_message(exc: ValidationError) -> str:
    return "invalid feedback: " + "; ".join(problem_lines(exc, FeedbackIn))


def _check_targets(parsed: FeedbackIn, ids_field: str) -> None:
    """What the model cannot say: something to be about, one turn in a session."""
    if not parsed.record_ids and parsed.session_id is None:
        raise InvalidInputError(f"invalid feedback: {ids_field} or session_id is required")
    if parsed.session_id is not None and len(parsed.record_ids) > 1:
        raise InvalidInputError(
            f"invalid feedback: {ids_field}: with session_id, name at most one record "
            f"(the turn the feedback targets), got {len(parsed.record_ids)}"
        )
    try:
        check_correction(parsed.correction)
    except InvalidInputError as exc:
        raise InvalidInputError(f"invalid feedback: {exc.message}") from exc


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

    def _check_score(self, score: float | None, scenario: str) -> None:
        low, high = self.state.settings.scenario(scenario).score_range
        if score is not None and not low <= score <= high:
            raise InvalidInputError(
                f"score {score:g} is outside scenario {scenario!r}'s score range "
                f"[{low:g}, {high:g}] (scenarios.{scenario}.score_range)"
            )

    async def _scenario_of(self, grant: Grant, record_id: str) -> str:
        """The scenario of the named record. A record of a scenario the key may not use
        is answered like one that does not exist: no existence oracle across scenarios."""
        record = await asyncio.to_thread(self.state.store.get_record, record_id)
        grant.check_resource(record.scenario, RecordNotFoundError(record_id))
        return record.scenario

    async def _receive(self, request: Request, ids_field: str) -> Response:
        grant = grant_of(request)
        principal = grant.principal
        body = await read_json_object(request, self.state.settings.server.max_body_bytes)
        if ids_field != "record_ids":
            if "record_ids" in body:
                raise InvalidInputError(f"use {ids_field!r} (not 'record_ids') on this route")
            if ids_field in body:
                body["record_ids"] = body.pop(ids_field)
        try:
            parsed = FeedbackIn.model_validate(body)
        except ValidationError as exc:
            message = _validation_message(exc).replace("record_ids", ids_field)
            raise InvalidInputError(message) from exc
        _check_targets(parsed, ids_field)
        key = parsed.idempotency_key or bounded_header(
            request, "x-reef-idempotency-key", MAX_IDEMPOTENCY_KEY_CHARS
        )
        # An empty header is no header, as on the inference routes.
        scenario = parsed.scenario or request.headers.get("x-reef-scenario") or None
        store = self.state.store
        if self.state.settings.store.durability == "async":
            # The records may still be queued; feedback must be able to name them.
            await self.state.writer.flush()
        if scenario is None and parsed.record_ids:
            scenario = await self._scenario_of(grant, parsed.record_ids[0])
        if scenario is None:  # a session alone: the scenario inference defaults to
            scenario = "default"
        check_scenario_name(scenario)
        grant.check_scenario(scenario)
        self._check_score(parsed.score, scenario)
        # Redacted like records (text, correction, metadata): nothing stored escapes the
        # capture.redact_patterns.
        redactor = self.state.recorder.redactor
        draft = FeedbackDraft(
            scenario=scenario,
            record_ids=tuple(parsed.record_ids),
            score=parsed.score,
            feedback=parsed.feedback,
            correction=parsed.correction,
            metadata=parsed.metadata,
            principal=principal.key_id,
            idempotency_key=key,
            trust=self.state.settings.trust_of(principal.key_id, scenario),
            session_id=parsed.session_id,
        )
        redacted = redactor.redact_feedback(draft)
        feedback_id, created = await asyncio.to_thread(store.add_feedback, redacted)
        if created:
            self._written(redacted, feedback_id)
        answer: dict[str, Any] = {
            "id": feedback_id,
            "created": created,
            "record_ids": parsed.record_ids,
        }
        if parsed.session_id is not None:
            answer["session_id"] = parsed.session_id
        return Response(
            dumps(answer),
            status_code=201 if created else 200,
            media_type="application/json",
        )

    def _written(self, draft: FeedbackDraft, feedback_id: str) -> None:
        """Count new feedback, and send it as an evaluation event when ``otel.enabled``."""
        self.state.metrics.feedback_written.inc()
        if self.state.live_export is not None:
            self.state.live_export.feedback(draft, feedback_id)

    async def list_feedback(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/feedback``: newest first; ``quarantined=true``
        lists what screening holds back (with the reason), ``false`` the rest; ``before``
        (a feedback id) and ``limit`` page."""
        scenario = check_scenario_name(request.path_params["scenario"])
        quarantined = _optional_bool(request.query_params.get("quarantined"), "quarantined")
        limit = query_int(request, "limit", 100, 1, MAX_FEEDBACK_PAGE)
        before = request.query_params.get("before")
        if before is not None and len(before) > MAX_CURSOR_CHARS:
            raise InvalidInputError(
                f"query parameter 'before' is longer than {MAX_CURSOR_CHARS} characters"
            )
        rows = await asyncio.to_thread(
            self.state.store.list_feedback, scenario, quarantined, before, limit + 1
        )
        page = rows[:limit]
        body = {
            "data": [row.as_dict() for row in page],
            "next_before": page[-1].id if len(rows) > limit else None,
        }
        return Response(dumps(body), media_type="application/json")

    async def release(self, request: Request) -> Response:
        """``POST /reef/feedback/{feedback_id}/release``: an admin lets quarantined
        feedback through (it may train and count as evidence again)."""
        grant = grant_of(request)
        feedback_id = request.path_params["feedback_id"]
        found = await asyncio.to_thread(self.state.store.get_feedback, feedback_id)
        grant.check_resource(found.scenario, FeedbackNotFoundError(feedback_id))
        view = await asyncio.to_thread(
            self.state.store.release_feedback, feedback_id, grant.principal.key_id or "operator"
        )
        return Response(dumps(view.as_dict()), media_type="application/json")


MAX_FEEDBACK_PAGE = 500
MAX_CURSOR_CHARS = 64  # a feedback id


def _optional_bool(value: str | None, name: str) -> bool | None:
    if value is None:
        return None
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise InvalidInputError(f"{name} must be true or false, got {value!r}")

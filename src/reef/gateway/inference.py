"""The inference routes: OpenAI chat completions and Anthropic messages, recorded."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from reef.core import dumps, new_id
from reef.core.errors import InvalidInputError, ReefError
from reef.gateway.activation import ServingRelease
from reef.gateway.body_checks import check_anthropic_messages, check_openai_chat
from reef.gateway.capture import (
    Api,
    Exchange,
    canonical_conversation,
    continuation_candidates,
)
from reef.gateway.errors import ErrorDialect, UnsupportedRouteError, error_response
from reef.gateway.relay import error_event, open_relay
from reef.gateway.requests import (
    SCENARIO_MODEL_PREFIX,
    read_json_object,
    reef_headers,
)
from reef.gateway.state import GatewayState
from reef.harness import render_anthropic, render_openai
from reef.upstream import (
    Upstream,
    UpstreamError,
    UpstreamMalformedError,
    UpstreamRequest,
    UpstreamStream,
    anthropic_request_to_openai,
    canonical_reply_anthropic,
    canonical_reply_openai,
    chain_hashes,
    openai_response_to_anthropic,
)

log = logging.getLogger("reef.gateway")

_ROUTES: dict[Api, str] = {
    "openai.chat": "/v1/chat/completions",
    "anthropic.messages": "/v1/messages",
}
_FORWARDED_ANTHROPIC_HEADERS = ("anthropic-beta", "anthropic-version")


@dataclass(frozen=True)
class CallPlan:
    """How one request reaches its upstream."""

    upstream: Upstream
    request: UpstreamRequest
    client_model: str
    translate: bool  # an Anthropic client served by an OpenAI-compatible upstream
    strip_usage: bool  # usage was requested upstream for the record, not by the client


class InferenceRoutes:
    """Route handlers for ``/v1/chat/completions`` and ``/v1/messages``."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def openai_chat(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._serve(request, "openai.chat")

    async def anthropic_messages(self, request: Request) -> Response:
        """``POST /v1/messages``."""
        return await self._serve(request, "anthropic.messages")

    async def _serve(self, request: Request, api: Api) -> Response:
        started = time.perf_counter()
        dialect: ErrorDialect = "openai" if api == "openai.chat" else "anthropic"
        try:
            exchange, plan = await self._prepare(request, api, started)
        except ReefError as exc:
            response = error_response(exc, dialect)
            self.state.metrics.observe(
                _ROUTES[api], response.status_code, time.perf_counter() - started
            )
            return response
        activation = self.state.activation
        activation.acquire(exchange.serving)  # its adapter stays loaded until we are done
        if plan.request.stream:
            return await self._stream(exchange, plan, dialect)
        try:
            return await self._complete(exchange, plan, dialect)
        finally:
            activation.release(exchange.serving)

    async def _prepare(
        self, request: Request, api: Api, started: float
    ) -> tuple[Exchange, CallPlan]:
        state = self.state
        principal = state.auth.authenticate(request)
        body = await read_json_object(request, state.settings.server.max_body_bytes)
        if api == "openai.chat":
            check_openai_chat(body)
        else:
            check_anthropic_messages(body)
        headers = reef_headers(request, body)
        principal.check_scenario(headers.scenario)
        activation = state.activation
        if headers.release is not None:
            serving = await activation.pinned(headers.scenario, headers.release)
        else:
            serving = await activation.current(headers.scenario)
        conversation = canonical_conversation(api, body)
        chain = chain_hashes(conversation)
        capture = headers.capture and state.settings.scenario(headers.scenario).capture
        record_id = new_id()
        session_id = headers.session_id
        if capture:
            if headers.idempotency_key is not None:
                existing = await state.recorder.existing_for_key(
                    headers.scenario, headers.idempotency_key
                )
                if existing is not None:
                    # A retry of a recorded exchange: same receipt, no second record.
                    record_id, capture = existing, False
            if session_id is None:
                session_id = await state.recorder.infer_session(
                    headers.scenario, continuation_candidates(conversation, chain)
                )
        session_is_new = session_id is None
        session_id = session_id or new_id()
        purpose = headers.purpose
        # A scenario without a live canary pays this one lookup. Only live traffic (no
        # pin, not eval) is split; the arm follows the session (given, inferred or new),
        # so a conversation stays on one arm.
        canary = activation.canaries.get(headers.scenario)
        if (
            canary is not None
            and headers.release is None
            and purpose == "serve"
            and canary.takes(session_id)
        ):
            serving, purpose = canary.serving, "canary"
        rendered = self._render(api, body, headers.scenario, serving)
        plan = self._plan(api, rendered, headers.scenario, request, serving)
        exchange = Exchange(
            api=api,
            record_id=record_id,
            scenario=headers.scenario,
            session_id=session_id,
            session_is_new=session_is_new,
            release_id=serving.release_id,
            serving=serving,
            rendered=rendered if rendered is not body else None,
            headers=headers,
            principal=principal,
            body=body,
            conversation=conversation,
            chain=chain,
            capture=capture,
            purpose=purpose,
            started=started,
        )
        return exchange, plan

    def _render(
        self, api: Api, body: dict[str, Any], scenario: str, serving: ServingRelease
    ) -> dict[str, Any]:
        """The request with the release's harness applied (managed scenarios only)."""
        if serving.harness is None or self.state.settings.scenario(scenario).harness != "managed":
            return body
        if api == "openai.chat":
            return render_openai(serving.harness, body)
        return render_anthropic(serving.harness, body)

    def _plan(
        self,
        api: Api,
        body: dict[str, Any],
        scenario: str,
        request: Request,
        serving: ServingRelease,
    ) -> CallPlan:
        settings = self.state.settings
        upstream_name, upstream_config = settings.upstream_for(scenario)
        upstream = self.state.upstreams[upstream_name]
        requested = body.get("model")
        client_model = requested if isinstance(requested, str) and requested else "reef/" + scenario
        model = client_model
        if serving.adapter_name is not None:
            model = serving.adapter_name  # the release's weights, whatever the client named
        elif client_model.startswith(SCENARIO_MODEL_PREFIX) or not requested:
            configured = (
                settings.scenario(scenario).model or serving.base_model or upstream_config.model
            )
            if not configured:
                raise InvalidInputError(
                    f"scenario {scenario!r} has no model configured: set "
                    f"scenarios.{scenario}.model or upstreams.{upstream_name}.model, "
                    "or send an upstream model name"
                )
            model = configured
        stream = bool(body.get("stream"))
        if api == "openai.chat":
            if upstream.dialect != "openai":
                raise UnsupportedRouteError(
                    f"scenario {scenario!r} is served by the Anthropic upstream "
                    f"{upstream_name!r}; call it through POST /v1/messages"
                )
            out = {**body, "model": model}
            strip_usage = False
            if stream:
                options = body.get("stream_options")
                wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
                strip_usage = not wants_usage
                out["stream_options"] = {**(options or {}), "include_usage": True}
            return CallPlan(
                upstream,
                UpstreamRequest("/chat/completions", dumps(out), stream),
                client_model,
                translate=False,
                strip_usage=strip_usage,
            )
        if upstream.dialect == "anthropic":
            forwarded = {
                name: value
                for name in _FORWARDED_ANTHROPIC_HEADERS
                if (value := request.headers.get(name)) is not None
            }
            return CallPlan(
                upstream,
                UpstreamRequest("/messages", dumps({**body, "model": model}), stream, forwarded),
                client_model,
                translate=False,
                strip_usage=False,
            )
        translated = anthropic_request_to_openai(body, model)
        return CallPlan(
            upstream,
            UpstreamRequest("/chat/completions", dumps(translated), stream),
            client_model,
            translate=True,
            strip_usage=False,
        )

    def _receipt(self, exchange: Exchange) -> dict[str, str]:
        headers = {
            "x-reef-release-id": exchange.release_id or "none",
            "x-reef-session-id": exchange.session_id,
        }
        if exchange.capture or exchange.headers.idempotency_key is not None:
            headers["x-reef-record-id"] = exchange.record_id
            headers["x-reef-agent-record-id"] = exchange.record_id
        if not exchange.headers.capture:
            headers["x-reef-capture"] = "off"
        return headers

    async def _fail(
        self, exchange: Exchange, plan: CallPlan, exc: UpstreamError, dialect: ErrorDialect
    ) -> Response:
        self.state.metrics.upstream_errors.labels(plan.upstream.name, type(exc).__name__).inc()
        if exchange.capture:
            recorder = self.state.recorder
            await recorder.record(recorder.draft(exchange, None, None, "error", exc.detail))
        response = error_response(exc, dialect, self._receipt(exchange))
        self._observe(exchange, response.status_code)
        return response

    def _observe(self, exchange: Exchange, status: int) -> None:
        elapsed = time.perf_counter() - exchange.started
        self.state.metrics.observe(_ROUTES[exchange.api], status, elapsed)

    async def _complete(
        self, exchange: Exchange, plan: CallPlan, dialect: ErrorDialect
    ) -> Response:
        try:
            answer = await plan.upstream.send(plan.request)
            try:
                data = orjson.loads(answer.body)
            except orjson.JSONDecodeError as exc:
                raise UpstreamMalformedError(f"upstream sent invalid JSON: {exc}") from exc
            if not isinstance(data, dict):
                raise UpstreamMalformedError("upstream sent a JSON document that is not an object")
        except UpstreamError as exc:
            return await self._fail(exchange, plan, exc, dialect)
        if plan.translate:
            reply = canonical_reply_openai(data)
            data = openai_response_to_anthropic(data, plan.client_model)
            payload = dumps(data)
        else:
            payload = answer.body
            if exchange.api == "openai.chat":
                reply = canonical_reply_openai(data)
            else:
                reply = canonical_reply_anthropic(data)
        if exchange.capture:
            recorder = self.state.recorder
            await recorder.record(recorder.draft(exchange, data, reply, "ok", None))
        self._observe(exchange, answer.status)
        return Response(
            payload,
            status_code=answer.status,
            media_type="application/json",
            headers=self._receipt(exchange),
        )

    async def _stream(self, exchange: Exchange, plan: CallPlan, dialect: ErrorDialect) -> Response:
        try:
            stream = await plan.upstream.open_stream(plan.request)
        except UpstreamError as exc:
            self.state.activation.release(exchange.serving)
            return await self._fail(exchange, plan, exc, dialect)
        return StreamingResponse(
            self._relay(exchange, plan, stream, dialect),
            media_type="text/event-stream",
            headers={**self._receipt(exchange), "cache-control": "no-cache"},
        )

    async def _relay(
        self, exchange: Exchange, plan: CallPlan, stream: UpstreamStream, dialect: ErrorDialect
    ) -> AsyncIterator[bytes]:
        """Relay the upstream's events while reassembling the full response for the record.

        When the client goes away the surrounding task is cancelled; the ``finally`` block
        then may not await, so it closes the upstream and records ``aborted`` through
        tasks of their own.
        """
        relay = open_relay(
            exchange.api,
            translate=plan.translate,
            strip_usage=plan.strip_usage,
            client_model=plan.client_model,
        )
        recorder = self.state.recorder
        recorded = False
        try:
            async for chunk in stream:
                out = relay.feed(chunk)
                if out:
                    yield out
            tail = relay.finish()
            if tail:
                yield tail
            recorded = True
            if exchange.capture:
                response, reply = relay.result()
                draft = recorder.draft(exchange, response, reply, "ok", None)
                # Shielded: a client leaving now must not lose (or duplicate) the record.
                await asyncio.shield(recorder.record(draft))
            # The end-of-stream event goes out only now, so a client that has seen the
            # whole stream can rely on the record (sync durability).
            if relay.terminal:
                yield relay.terminal
            self._observe(exchange, 200)
        except UpstreamError as exc:
            self.state.metrics.upstream_errors.labels(plan.upstream.name, type(exc).__name__).inc()
            recorded = True
            if exchange.capture:
                response, _ = relay.result()
                draft = recorder.draft(exchange, response, None, "error", exc.detail)
                await asyncio.shield(recorder.record(draft))
            self._observe(exchange, exc.status)
            yield error_event(exc, dialect)
        finally:
            self.state.activation.release(exchange.serving)
            if not recorded:
                asyncio.get_running_loop().create_task(stream.aclose())
                if exchange.capture:
                    response, _ = relay.result()
                    draft = recorder.draft(
                        exchange, response, None, "aborted", "client disconnected mid-stream"
                    )
                    recorder.record_in_background(draft)
                self._observe(exchange, 499)
        await stream.aclose()

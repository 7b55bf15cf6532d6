"""The inference routes: OpenAI chat completions, responses, legacy text completions
and embeddings, Anthropic messages; recorded."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, AsyncExitStack
from dataclasses import dataclass, replace
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from reef.config import UpstreamConfig
from reef.config.spend import LearningBudgetLimit
from reef.core import dumps, new_id
from reef.core.errors import ConflictError, InvalidInputError, ReefError
from reef.core.prices import Price, usage_tokens
from reef.evaluation import SHADOW_OF_TAG, shadow_budgets
from reef.experience import Claim, LearningMeter, Purpose, RecordView
from reef.gateway.auth import Principal, grant_of
from reef.gateway.body_checks import (
    check_anthropic_messages,
    check_openai_chat,
    check_openai_completions,
    check_openai_embeddings,
)
from reef.gateway.budgets import request_estimate
from reef.gateway.capture import (
    Api,
    Exchange,
    canonical_conversation,
    continuation_candidates,
    embeddings_for_record,
)
from reef.gateway.distill import (
    ESCALATE_HEADER,
    ResumedStream,
    RoutingOutcome,
    StreamPeek,
    asked_logprobs,
    choose_arm,
    escalation_rule,
    reply_of,
    student_first,
    wants_logprobs,
    without_logprobs,
)
from reef.gateway.errors import (
    ErrorDialect,
    InvalidFieldError,
    UnsupportedRouteError,
    client_gone,
    error_event,
    error_response,
    log_failure,
    server_error,
)
from reef.gateway.idempotency import (
    Answer,
    IdempotencyKeyInUseError,
    IdempotentFlights,
    Lead,
    request_fingerprint,
)
from reef.gateway.replay import stored_answer
from reef.gateway.requests import (
    SCENARIO_MODEL_PREFIX,
    ReefHeaders,
    check_known_scenario,
    read_json_object,
    reef_headers,
)
from reef.gateway.responses.checks import check_openai_responses, check_responses_for_anthropic
from reef.gateway.responses.receipt import stream_receipt
from reef.gateway.responses.stored import response_to_keep
from reef.gateway.responses.turns import ResponsesTurn, TurnContext, resolve_turn
from reef.gateway.segments import one_segment
from reef.gateway.serving.pins import pin_access
from reef.gateway.serving.release import ServingRelease
from reef.gateway.shadow import ShadowArm
from reef.gateway.shutdown import STOPPED, GatewayStoppedError
from reef.gateway.state import GatewayState
from reef.harness import render_anthropic, render_openai, render_responses
from reef.releases import TeacherEndpoint
from reef.upstream import (
    Upstream,
    UpstreamError,
    UpstreamMalformedError,
    UpstreamRejectedError,
    UpstreamRequest,
    UpstreamResponse,
    UpstreamStream,
    UpstreamUnsupportedError,
    anthropic_request_to_openai,
    anthropic_response_to_openai,
    canonical_reply_anthropic,
    canonical_reply_completions,
    canonical_reply_openai,
    canonical_reply_responses,
    chain_hashes,
    openai_request_to_anthropic,
    openai_response_to_anthropic,
    openai_response_to_responses,
)
from reef.upstream.relay import (
    AnthropicRelay,
    CompletionsRelay,
    OpenAIRelay,
    StreamRelay,
    TranslatedRelay,
)
from reef.upstream.responses.relay import (
    AnthropicResponsesRelay,
    NativeResponsesRelay,
    ResponsesRelay,
)

log = logging.getLogger("reef.gateway")

_ROUTES: dict[Api, str] = {
    "openai.chat": "/v1/chat/completions",
    "anthropic.messages": "/v1/messages",
    "openai.responses": "/v1/responses",
    "openai.completions": "/v1/completions",
    "openai.embeddings": "/v1/embeddings",
}
_CHECKS: dict[Api, Callable[[dict[str, Any]], None]] = {
    "openai.chat": check_openai_chat,
    "anthropic.messages": check_anthropic_messages,
    "openai.responses": check_openai_responses,
    "openai.completions": check_openai_completions,
    "openai.embeddings": check_openai_embeddings,
}
_FORWARDED_ANTHROPIC_HEADERS = ("anthropic-beta", "anthropic-version")
_MODELS_NAMED = 50  # of an upstream's models, in the 404 for a model it does not serve
# By a distilled release's routing: every API that generates (a vector is no answer).
_ROUTED: frozenset[Api] = frozenset(
    {"openai.chat", "anthropic.messages", "openai.responses", "openai.completions"}
)
_T = TypeVar("_T")
# Idempotency claims (``reef.experience.claims``): how much longer than its upstream
# calls' total timeouts a claim lasts, and how often a request polls the store while
# another gateway answers it (doubling from the first to the last).
CLAIM_MARGIN_SECONDS = 30.0
_FIRST_POLL_SECONDS = 0.02
_LAST_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class CallPlan:
    """How one request reaches its upstream."""

    upstream: Upstream
    request: UpstreamRequest
    client_model: str
    translate: bool  # an Anthropic or Responses client on an OpenAI-compatible upstream
    strip_usage: bool  # usage was requested upstream for the record, not by the client
    model_from_client: bool = False  # no model configured: the client's name went upstream
    native: bool = False  # a Responses request passed through to the upstream's /responses
    on_anthropic: bool = False  # a Responses request sent to the Anthropic API as Messages
    # A distilled release's teacher, asked when the student is escalated
    # (``reef.gateway.distill``), and whether Reef asked for token logprobs the client
    # did not: the student's for the logprob rule, or (``logprobs_kept``) the teacher's
    # top logprobs for logit distillation, kept in the record but not sent to the client.
    teacher: CallPlan | None = None
    logprobs_added: bool = False
    logprobs_kept: bool = False


class InferenceEndpoint:
    """One inference route as an ASGI app (the fast path and the ``Route`` call it)."""

    def __init__(self, routes: InferenceRoutes, api: Api) -> None:
        self.routes = routes
        self.api: Api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.routes.serve(scope, receive, send, self.api)


class InferenceRoutes:
    """Route handlers for ``/v1/chat/completions``, ``/v1/messages``, ``/v1/responses``,
    ``/v1/completions`` and ``/v1/embeddings``."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.flights = IdempotentFlights()
        self.openai_chat = InferenceEndpoint(self, "openai.chat")  # POST /v1/chat/completions
        self.anthropic_messages = InferenceEndpoint(self, "anthropic.messages")  # /v1/messages
        self.openai_responses = InferenceEndpoint(self, "openai.responses")  # /v1/responses
        self.openai_completions = InferenceEndpoint(self, "openai.completions")  # /v1/completions
        self.openai_embeddings = InferenceEndpoint(self, "openai.embeddings")  # /v1/embeddings
        self._closing: set[asyncio.Task[None]] = set()
        self._owner = f"{socket.gethostname()}:{os.getpid()}"  # of idempotency claims
        self._waits = state.metrics.idempotency_waits
        # Live requests also sent to an evaluating candidate (``reef.gateway.shadow``).
        self.shadow = ShadowArm(
            state.activation, self.shadow_call, state.metrics.count_shadow, self.shadow_meter
        )

    async def serve(self, scope: Scope, receive: Receive, send: Send, api: Api) -> None:
        """Answer one request of ``api``.

        What a request holds while it is answered (its adapter lease, the lead of its
        idempotency key, an upstream stream) is entered on one exit stack around the
        whole response, so each is let go exactly once: when the response has been
        sent, streamed to its end, cut short, or never read at all.
        """
        request = Request(scope, receive)
        async with _Held() as held:
            try:
                response = await self._respond(request, api, held)
            except ReefError as exc:  # e.g. the store could not record the answer
                response = self._error(request, api, exc)
            except ClientDisconnect as exc:  # gone while its body was read
                response = await client_gone(request, exc)
            except Exception as exc:
                response = await server_error(request, exc)
            # An ASGI 2.4 server's word for a client gone; the stack lets go of the rest.
            with contextlib.suppress(ClientDisconnect):
                if isinstance(response, StreamingResponse):
                    body = response.body_iterator
                    if isinstance(body, _ClientBody):
                        receive = body.departure.watch(receive)
                    await response(scope, receive, send)
                else:
                    with one_segment(send):  # headers and body in one write
                        await response(scope, receive, send)
        # Sent in full and let go of: only now may a shadow call start (it never waits).
        if held.shadow is not None and response.status_code == 200:
            self.shadow.offer(held.shadow, request)

    def _error(self, request: Request, api: Api, exc: ReefError) -> Response:
        """A ``ReefError`` raised once the exchange was under way, in the API's dialect
        (a store that cannot record it: 503 with ``Retry-After``, logged once)."""
        response = error_response(exc, "anthropic" if api == "anthropic.messages" else "openai")
        log_failure(request, exc, response.status_code, self.state.store_health)
        return response

    async def _respond(self, request: Request, api: Api, held: _Held) -> Response:
        started = time.perf_counter()
        dialect: ErrorDialect = "anthropic" if api == "anthropic.messages" else "openai"
        lead: Lead | None = None
        try:
            exchange, plan = await self._prepare(request, api, started, held)
            key = exchange.headers.idempotency_key
            if exchange.capture and key is not None:
                fingerprint = request_fingerprint(api, exchange.body, exchange.principal.key_id)
                joined = await self.flights.join(exchange.scenario, key, fingerprint)
                if isinstance(joined, Answer):  # the same request, answered meanwhile
                    self._waits.labels("process").inc()
                    self._observe(exchange, joined.status)
                    return joined.response()
                lead = held.enter_context(joined)
                answer = await self._claim(exchange, plan, key, fingerprint, held)
                if answer is not None:  # from the store: no upstream call
                    lead.settle(answer)
                    self._observe(exchange, answer.status)
                    return answer.response()
        except ReefError as exc:
            response = error_response(exc, dialect)
            self.state.metrics.observe(
                _ROUTES[api], response.status_code, time.perf_counter() - started
            )
            return response
        try:  # only a request that will call its upstream takes a reservation
            await self._admit(exchange, plan)
        except ReefError as exc:  # over a budget (402) or a rate limit (429)
            response = error_response(exc, dialect)
            self._observe(exchange, response.status_code)
            return response
        if plan.request.stream:
            response = await self._stream(exchange, plan, dialect, held, lead)
        else:
            response = await self._complete(exchange, plan, dialect)
        if lead is not None and not isinstance(response, StreamingResponse):
            lead.settle(Answer.of(response), self._committed())
        if ShadowArm.eligible(exchange):
            held.shadow = exchange
        return response

    async def _claim(
        self,
        exchange: Exchange,
        plan: CallPlan,
        key: str,
        fingerprint: str,
        held: _Held,
    ) -> Answer | None:
        """Claim ``key`` in the store for this gateway's flight (``reef.experience.claims``,
        released when the response is done): the answer of the record that holds the
        key, or ``None`` when there is none and this request goes upstream.

        A live claim of the same request by another gateway is waited for until its
        record is stored (at most this request's lease); a claim whose lease ran out is
        taken over. Raises ``IdempotencyKeyInUseError`` for a claim of another request,
        or a record of one."""
        if not exchange.replayable:  # its record keeps no key: nothing to wait for
            return await self._stored_answer(exchange, key)
        claims = self.state.claims
        scenario = exchange.scenario
        owner = f"{self._owner}/{exchange.record_id}"
        lease = self._lease(plan)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + lease.total_seconds()
        delay = _FIRST_POLL_SECONDS
        claim = await asyncio.to_thread(claims.claim, scenario, key, fingerprint, owner, lease)
        counted = False
        while claim.owner != owner:
            if claim.request_hash != fingerprint:
                raise IdempotencyKeyInUseError(scenario, key)
            if not counted:  # once, when it starts waiting
                self._waits.labels("store").inc()
                counted = True
            if loop.time() >= give_up:
                raise ConflictError(
                    f"idempotency key {key!r} in scenario {scenario!r} is still being "
                    f"answered by another gateway after {lease.total_seconds():.0f}s; "
                    "retry later"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _LAST_POLL_SECONDS)
            answer = await self._stored_answer(exchange, key)
            if answer is not None:
                return answer
            found = await asyncio.to_thread(claims.held, scenario, key)
            if found is None or found.expires_at <= claims.clock():  # released, or died
                claim = await asyncio.to_thread(
                    claims.claim, scenario, key, fingerprint, owner, lease
                )
            else:
                claim = found
        held.push_async_callback(self._let_go, claim)
        # Claimed: unless a record holds the key already (its gateway may have released
        # the key just before), this request goes upstream.
        return await self._stored_answer(exchange, key)

    async def _stored_answer(self, exchange: Exchange, key: str) -> Answer | None:
        """The answer of the record stored under ``key``, if there is one."""
        stored = await self.state.recorder.stored_for_key(exchange.scenario, key)
        return None if stored is None else self._replay(exchange, stored)

    def _lease(self, plan: CallPlan) -> timedelta:
        """How long a claim lasts: until its upstream calls would have timed out (the
        student's and its teacher's, for a distilled release), and a margin to write
        the record."""
        seconds = CLAIM_MARGIN_SECONDS
        upstreams = self.state.settings.upstreams
        step: CallPlan | None = plan
        while step is not None:
            config = upstreams.get(step.upstream.name)
            seconds += config.total_timeout_seconds if config is not None else 600.0
            step = step.teacher
        return timedelta(seconds=seconds)

    async def _let_go(self, claim: Claim) -> None:
        """The response under ``claim`` is done: release the claim once the records
        queued so far are committed, so a gateway that then finds the key free finds
        the record that holds it too. (Whether there was an answer is not known for
        sure: a client may leave as soon as it read a stream's last event, before the
        stream's end, after its record was queued.)"""
        committed = self._committed()
        task = asyncio.get_running_loop().create_task(self._release(claim, committed))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _release(
        self, claim: Claim, committed: Callable[[], Awaitable[object]] | None
    ) -> None:
        try:
            if committed is not None:
                await committed()
            await asyncio.to_thread(
                self.state.claims.release, claim.scenario, claim.key, claim.owner
            )
        except Exception as exc:  # its lease runs out instead
            log.warning(
                "could not release the claim on idempotency key %r (scenario %r): %s; "
                "it lapses at %s",
                claim.key,
                claim.scenario,
                exc,
                claim.expires_at.isoformat(),
            )

    def _replay(self, exchange: Exchange, view: RecordView) -> Answer:
        """The answer of the record stored under this request's idempotency key.

        Raises ``IdempotencyKeyInUseError`` when that record is of another request, and
        ``ConflictError`` when it holds no complete answer (written before failures
        stopped holding keys).
        """
        key = exchange.headers.idempotency_key or ""
        same = (
            view.api == exchange.api
            and view.principal == exchange.principal.key_id
            and view.request == self.state.recorder.redactor.redact(exchange.body)
        )
        if not same:
            raise IdempotencyKeyInUseError(exchange.scenario, key)
        if view.status != "ok" or view.response is None:
            raise ConflictError(
                f"the exchange stored under idempotency key {key!r} ended with status "
                f"{view.status!r}; send a new key to try again"
            )
        receipt = {
            "x-reef-release-id": view.release_id or "none",
            "x-reef-session-id": view.session_id,
            "x-reef-record-id": view.id,
            "x-reef-agent-record-id": view.id,
        }
        return stored_answer(view, receipt)

    def _committed(self) -> Callable[[], Awaitable[object]] | None:
        """What an idempotency key's answer waits for before the store can give it."""
        if self.state.settings.store.durability == "sync":
            return None  # a complete answer's record is committed already
        return self.state.writer.flush

    async def _prepare(
        self, request: Request, api: Api, started: float, held: _Held
    ) -> tuple[Exchange, CallPlan]:
        state = self.state
        grant = grant_of(request)
        principal = grant.principal
        body = await read_json_object(request, state.settings.server.max_body_bytes)
        _CHECKS[api](body)
        headers = reef_headers(request, body, state.model_aliases)
        grant.check_scenario(headers.scenario)
        check_known_scenario(
            headers.scenario,
            state.settings.scenarios,
            state.settings.server.unknown_scenarios,
            grant.visible,
        )
        record_id = new_id()
        capture = headers.capture and state.settings.scenario(headers.scenario).capture
        turn = None
        if api == "openai.responses":
            context = TurnContext(headers.scenario, principal, capture)
            turn = await resolve_turn(state.responses, context, body, record_id)
            body = turn.body  # the whole conversation, as the record keeps it
        activation = state.activation
        serving, asked = await self._serving(headers, principal)
        conversation = canonical_conversation(api, body)
        chain = chain_hashes(conversation)
        session_id = headers.session_id
        if session_id is None and turn is not None and turn.previous is not None:
            session_id = turn.previous.session_id  # a continued response joins its session
        if capture and session_id is None:
            session_id = await state.recorder.infer_session(
                headers.scenario, continuation_candidates(conversation, chain)
            )
        session_is_new = session_id is None
        session_id = session_id or new_id()
        while True:
            # A scenario without a live canary pays this one lookup. Only live traffic
            # (no pin, not eval) is split; the arm follows the session (given, inferred
            # or new), so a conversation stays on one arm.
            chosen, purpose = serving, asked
            canary = activation.canaries.get(headers.scenario)
            if (
                canary is not None
                and headers.release is None
                and purpose == "serve"
                and canary.takes(session_id)
                and activation.admits(canary.serving)
            ):
                chosen, purpose = canary.serving, "canary"
            if activation.admits(chosen):
                break
            # An upstream that reloads in place is swapping, or holds other weights:
            # wait, then choose again (a pinned request for other weights is refused).
            await activation.settle(chosen, pinned=headers.release is not None)
            serving, asked = await self._serving(headers, principal)
        serving = chosen
        # Held from here to the end of the response, however it ends, with no await
        # between the check above and this: its adapter stays loaded, and an in-place
        # upstream waits for it before it reloads. (Most requests hold nothing.)
        lease = activation.lease(serving)
        if lease is not None:
            held.enter_context(lease)
        source, rendered = self._outgoing(api, body, turn, headers.scenario, serving)
        plan = self._plan(api, rendered, request, serving, body.get("model"))
        outcome = None
        if serving.routing is not None and api in _ROUTED:
            routed = serving
            if headers.release is not None and activation.pinned_candidate(serving.release_id):
                # A pinned candidate's requests are the student's first, as at full share:
                # what the gate measures is the student it would serve.
                routed = replace(serving, routing=student_first(serving.routing))
            taught = self._taught(api, body, rendered, turn, serving)
            plan, outcome = self._route(api, taught, request, routed, plan, record_id)
        keep_vectors = state.settings.capture.embedding_vectors == "keep"
        exchange = Exchange(
            api=api,
            record_id=record_id,
            scenario=headers.scenario,
            session_id=session_id,
            session_is_new=session_is_new,
            release_id=serving.release_id,
            serving=serving,
            weights_digest=activation.verified_digest(serving),
            rendered=rendered if rendered is not source else None,
            headers=headers,
            principal=principal,
            body=body,
            conversation=conversation,
            chain=chain,
            capture=capture,
            purpose=purpose,
            started=started,
            responses=turn,
            # An embeddings record without its vectors cannot answer a retry by its key.
            replayable=api != "openai.embeddings" or keep_vectors,
            outcome=outcome,
        )
        return exchange, plan

    def _taught(
        self,
        api: Api,
        body: dict[str, Any],
        rendered: dict[str, Any],
        turn: ResponsesTurn | None,
        serving: ServingRelease,
    ) -> dict[str, Any]:
        """What a distilled release's teacher is sent: the student's request
        (``rendered``), except that a Responses request takes the form the teacher's own
        upstream is asked in (its chat translation, or itself when ``native``)."""
        if turn is None or serving.routing is None:
            return rendered
        teacher = serving.routing.teacher
        return self._outgoing(api, body, turn, serving.scenario, serving, teacher)[1]

    def _route(
        self,
        api: Api,
        taught: dict[str, Any],
        request: Request,
        serving: ServingRelease,
        plan: CallPlan,
        record_id: str,
    ) -> tuple[CallPlan, RoutingOutcome | None]:
        """A distilled release's plan for the request: the teacher's when it answers
        first (by share, or asked for by header; its outcome is then known), else the
        student's (``plan``) with the teacher's plan beside it, for an escalation.
        ``taught`` is the request as the teacher's upstream is sent it (``_outgoing``)."""
        routing = serving.routing
        assert routing is not None
        # The name the client gave (a Responses request's translation has none).
        requested = plan.client_model
        teacher = self._plan(api, taught, request, serving, requested, routing.teacher)
        top = self._teacher_logprobs(serving.scenario)
        if top and api == "openai.chat":  # logit distillation (docs/distillation.md)
            teacher = _with_logprobs(teacher, taught, top)
            teacher = replace(teacher, logprobs_kept=teacher.logprobs_added)
        arm, rule = choose_arm(routing, record_id, request.headers.get(ESCALATE_HEADER))
        if arm == "teacher":
            return teacher, RoutingOutcome("teacher", rule)
        # Chat asks for logprobs with ``true``, a text completion with a count (1: the
        # sampled token's, 0 asks for them too); a Responses upstream's own API is not
        # asked for them.
        path = plan.request.path
        added = False
        if wants_logprobs(routing.escalation) and not plan.request.stream:
            sent = orjson.loads(plan.request.body)
            asked = sent.get("logprobs")
            if path == "/chat/completions" and asked is not True:
                added, sent["logprobs"] = True, True
            elif path == "/completions" and (asked is None or isinstance(asked, bool)):
                added, sent["logprobs"] = True, 1
            if added:
                plan = replace(plan, request=replace(plan.request, body=dumps(sent)))
        return replace(plan, teacher=teacher, logprobs_added=added), None

    def _teacher_logprobs(self, scenario: str) -> int:
        """How many top logprobs per token ``scenario``'s teacher is asked for (its
        ``distill.teacher_logprobs``; 0: none)."""
        config = self.state.settings.scenarios.get(scenario)
        distill = config.distill if config is not None else None
        return distill.teacher_logprobs if distill is not None else 0

    async def _admit(self, exchange: Exchange, plan: CallPlan) -> None:
        """Price the exchange, and take its reservation on its budgets and rate limits
        (``reef.gateway.budgets``): 402 or 429 when refused."""
        spend = self.state.spend
        scenario = exchange.scenario
        requested = exchange.body.get("model")
        base_model = exchange.serving.base_model
        exchange.price = spend.price_for(scenario, base_model, requested, plan.model_from_client)
        routing = exchange.serving.routing
        if exchange.outcome is not None and routing is not None:  # the teacher answers
            exchange.price = spend.price_at(routing.teacher.upstream, routing.teacher.model)
        if not spend.enabled:
            return
        estimate = request_estimate(
            plan.request.body, exchange.body, self.state.settings.budgets.default_max_tokens
        )
        exchange.charge = await spend.admit(
            scenario, exchange.principal.key_id, estimate, exchange.price
        )

    async def _used(self, exchange: Exchange, response: dict[str, Any] | None) -> None:
        """Count what an answered exchange used (``/metrics``) and settle its charge to
        it (an answer without usage keeps its reservation)."""
        usage = response.get("usage") if response is not None else None
        tokens = usage_tokens(usage)
        cost = exchange.price.cost(tokens) if exchange.price and tokens else None
        exchange.used = (usage, cost)
        self.state.spend.count(exchange.scenario, exchange.purpose, tokens, cost)
        outcome = exchange.outcome
        if outcome is not None and exchange.serving.routing is not None:
            share = exchange.serving.routing.student_share
            self.state.distill.count(exchange.scenario, share, outcome)
            student = outcome.student_tokens
            if exchange.charge is not None and tokens is not None and student is not None:
                # Both attempts settle the student's reservation, each at its own price.
                money = (cost or 0.0) + (outcome.student_cost or 0.0)
                await exchange.charge.settle_counted(tokens.total + student.total, money)
        charge = exchange.charge
        if charge is not None and tokens is not None:
            await charge.settle(tokens, cost if charge.price is exchange.price else None)

    @staticmethod
    async def _uncharged(exchange: Exchange) -> None:
        """The exchange's upstream call failed: its reservation is given back."""
        if exchange.charge is not None:
            await exchange.charge.settle(None)

    async def _serving(
        self, headers: ReefHeaders, principal: Principal
    ) -> tuple[ServingRelease, Purpose]:
        """The release the request pins (if ``principal`` may pin it), or the one its
        scenario serves now; and the purpose it is recorded with: the request's, or
        ``eval`` for a candidate pinned while nothing decides it (``serving.pins``)."""
        activation = self.state.activation
        if headers.release is None:
            return await activation.current(headers.scenario), headers.purpose
        access = pin_access(principal, activation.gate_key)
        pinned = await activation.pinned(headers.scenario, headers.release, principal, access)
        return pinned.serving, "eval" if pinned.eval_only else headers.purpose

    def _outgoing(
        self,
        api: Api,
        body: dict[str, Any],
        turn: ResponsesTurn | None,
        scenario: str,
        serving: ServingRelease,
        teacher: TeacherEndpoint | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """What goes upstream (the scenario's, or ``teacher``'s when given) before its
        model is set, as the client's request made it and with the release's harness
        rendered in (the same object when none was)."""
        if turn is None:
            return body, self._render(api, body, scenario, serving)
        upstream_name, upstream_config = self._upstream_of(scenario, teacher)
        if upstream_config.type == "anthropic":
            try:
                check_responses_for_anthropic(turn.body)
            except InvalidFieldError as exc:
                if teacher is None:
                    raise
                raise InvalidFieldError(
                    exc.param, f"{exc.message} (the release's teacher {upstream_name!r})"
                ) from exc
        if upstream_config.responses == "native":
            # Passed through as the record keeps it (the conversation Reef resolved from
            # previous_response_id, which the upstream never saw), the harness rendered
            # into it as a Responses request.
            native = {k: v for k, v in turn.body.items() if k != "previous_response_id"}
            return native, self._render(api, native, scenario, serving)
        # A Responses request is rendered and sent as its chat-completions translation
        # (on to Anthropic Messages from there, for an Anthropic upstream).
        return turn.chat, self._render("openai.chat", turn.chat, scenario, serving)

    def _render(
        self, api: Api, body: dict[str, Any], scenario: str, serving: ServingRelease
    ) -> dict[str, Any]:
        """The request with the release's harness applied (managed scenarios only; a
        harness renders into conversations, so text completions and embeddings go as
        sent)."""
        if serving.harness is None or self.state.settings.scenario(scenario).harness != "managed":
            return body
        if api in ("openai.completions", "openai.embeddings"):
            return body
        if api == "openai.chat":
            return render_openai(serving.harness, body)
        if api == "openai.responses":  # passed through natively: rendered as Responses
            return render_responses(serving.harness, body)
        return render_anthropic(serving.harness, body)

    def _plan(
        self,
        api: Api,
        body: dict[str, Any],
        request: Request,
        serving: ServingRelease,
        requested: Any,
        teacher: TeacherEndpoint | None = None,
    ) -> CallPlan:
        """How ``body`` (rendered; a Responses request's chat translation) reaches the
        upstream of ``serving``'s scenario (``teacher``'s upstream and model when
        given); ``requested`` is the model the client named."""
        scenario = serving.scenario
        upstream_name, upstream_config = self._upstream_of(scenario, teacher)
        upstream = self.state.upstreams[upstream_name]
        client_model = requested if isinstance(requested, str) and requested else "reef/" + scenario
        chat_like = api in ("openai.chat", "openai.completions")
        if teacher is not None and chat_like and upstream.dialect != "openai":
            raise UnsupportedRouteError(
                f"the release of scenario {scenario!r} routes to the teacher "
                f"{teacher.upstream!r}, an Anthropic upstream, which has no POST "
                f"{_ROUTES[api]}: use an OpenAI-compatible teacher (routing.teacher, "
                f"scenarios.{scenario}.distill.teacher) or call POST /v1/messages"
            )
        if api in ("openai.completions", "openai.embeddings") and upstream.dialect != "openai":
            raise UpstreamUnsupportedError(
                f"scenario {scenario!r} is served by the Anthropic upstream {upstream_name!r}, "
                f"which has no POST {_ROUTES[api]}: it needs an OpenAI-compatible upstream "
                "(call an Anthropic model through POST /v1/messages)"
            )
        if api == "openai.embeddings":
            return self._embeddings_plan(scenario, upstream_name, upstream, body, requested)
        # A teacher's model replaces the app's model name.
        model, model_from_client = (
            (teacher.model, False) if teacher else self._model(scenario, serving, requested)
        )
        stream = bool(body.get("stream"))
        if api == "openai.responses" and upstream.dialect == "anthropic":
            messages = openai_request_to_anthropic(body, model)
            return CallPlan(
                upstream,
                UpstreamRequest("/messages", dumps(messages), stream),
                client_model,
                translate=True,
                strip_usage=False,
                model_from_client=model_from_client,
                on_anthropic=True,
            )
        if api == "openai.responses":
            native = upstream_config.responses == "native"
            return CallPlan(
                upstream,
                UpstreamRequest(
                    "/responses" if native else "/chat/completions",
                    dumps({**body, "model": model}),
                    stream,
                ),
                client_model,
                translate=not native,
                strip_usage=False,
                model_from_client=model_from_client,
                native=native,
            )
        if api in ("openai.chat", "openai.completions"):
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
            path = "/chat/completions" if api == "openai.chat" else "/completions"
            return CallPlan(
                upstream,
                UpstreamRequest(path, dumps(out), stream),
                client_model,
                translate=False,
                strip_usage=strip_usage,
                model_from_client=model_from_client,
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
                model_from_client=model_from_client,
            )
        translated = anthropic_request_to_openai(body, model)
        return CallPlan(
            upstream,
            UpstreamRequest("/chat/completions", dumps(translated), stream),
            client_model,
            translate=True,
            strip_usage=False,
            model_from_client=model_from_client,
        )

    def _upstream_of(
        self, scenario: str, teacher: TeacherEndpoint | None
    ) -> tuple[str, UpstreamConfig]:
        """The upstream a request of ``scenario`` goes to: the teacher's when given."""
        if teacher is None:
            return self.state.settings.upstream_for(scenario)
        return teacher.upstream, self.state.settings.upstreams[teacher.upstream]

    def _model(self, scenario: str, serving: ServingRelease, requested: Any) -> tuple[str, bool]:
        """The model a generating request sends upstream, and whether it is the client's
        own name (``requested``); ``InvalidInputError`` when there is none to send."""
        settings = self.state.settings
        upstream_name, upstream_config = settings.upstream_for(scenario)
        configured = (
            settings.scenario(scenario).model or serving.base_model or upstream_config.model
        )
        client_model = requested if isinstance(requested, str) and requested else "reef/" + scenario
        if serving.weights_name is not None:
            return serving.weights_name, False  # the release's weights, whatever was named
        if configured:
            # An application keeps its own model name ("gpt-4o"): the scenario's model
            # serves it, and the record keeps the request as the client sent it.
            return configured, False
        if (
            client_model.startswith(SCENARIO_MODEL_PREFIX)
            or not requested
            or client_model in self.state.model_aliases
        ):
            # Neither a reef/ name nor an alias is a model an upstream knows.
            raise InvalidInputError(
                f"scenario {scenario!r} has no model configured: set "
                f"scenarios.{scenario}.model or upstreams.{upstream_name}.model, "
                f"or send an upstream model name (not {client_model!r})"
            )
        return client_model, True

    def _embeddings_plan(
        self,
        scenario: str,
        upstream_name: str,
        upstream: Upstream,
        body: dict[str, Any],
        requested: Any,
    ) -> CallPlan:
        """An embeddings request goes upstream under the client's own model name (an
        embedding model, not the scenario's chat model); ``reef/<scenario>`` or an alias
        gets the scenario's configured model. Never a release's adapter: adapters are
        generative weights."""
        settings = self.state.settings
        named = (
            isinstance(requested, str)
            and bool(requested)
            and not requested.startswith(SCENARIO_MODEL_PREFIX)
            and requested not in self.state.model_aliases
        )
        if named:
            model, from_client = str(requested), True
        else:
            configured = (
                settings.scenario(scenario).model or settings.upstreams[upstream_name].model
            )
            if not configured:
                raise InvalidInputError(
                    f"scenario {scenario!r} has no model configured: name an embedding model "
                    f"(not {requested!r}), or set scenarios.{scenario}.model or "
                    f"upstreams.{upstream_name}.model"
                )
            model, from_client = configured, False
        client_model = str(requested) if named else model
        request = UpstreamRequest("/embeddings", dumps({**body, "model": model}), False)
        return CallPlan(
            upstream, request, client_model, False, False, model_from_client=from_client
        )

    def _receipt(self, exchange: Exchange, recorded: bool = True) -> dict[str, str]:
        headers = {
            "x-reef-release-id": exchange.release_id or "none",
            "x-reef-session-id": exchange.session_id,
        }
        if exchange.capture and recorded:
            headers["x-reef-record-id"] = exchange.record_id
            headers["x-reef-agent-record-id"] = exchange.record_id
        if not exchange.headers.capture:
            headers["x-reef-capture"] = "off"
        if exchange.outcome is not None:
            headers["x-reef-served-by"] = exchange.outcome.served_by
        return headers

    async def _fail(
        self, exchange: Exchange, plan: CallPlan, exc: UpstreamError, dialect: ErrorDialect
    ) -> Response:
        stopped = isinstance(exc, GatewayStoppedError)
        await self._uncharged(exchange)
        if not stopped:
            self.state.metrics.upstream_errors.labels(plan.upstream.name, type(exc).__name__).inc()
        if plan.model_from_client and isinstance(exc, UpstreamRejectedError) and exc.status == 404:
            exc = await self._unknown_model(plan, exc)
        # An upstream without the route (it answered 501) exchanged nothing: no record.
        recorded = exchange.capture and not isinstance(exc, UpstreamUnsupportedError)
        if recorded:
            recorder = self.state.recorder
            status: Literal["aborted", "error"] = "aborted" if stopped else "error"
            draft = recorder.draft(exchange, None, None, status, exc.detail)
            await recorder.record(draft)
        response = error_response(exc, dialect, self._receipt(exchange, recorded))
        self._observe(exchange, response.status_code)
        return response

    async def _unknown_model(self, plan: CallPlan, exc: UpstreamError) -> UpstreamError:
        """A 404 for a model the client named on a passthrough upstream, naming the
        models the upstream has (``exc`` itself when it cannot list them)."""
        try:
            models = await plan.upstream.list_models()
        except UpstreamError:
            return exc
        named = ", ".join(models[:_MODELS_NAMED]) or "none"
        if len(models) > _MODELS_NAMED:
            named += f" and {len(models) - _MODELS_NAMED} more"
        return UpstreamRejectedError(
            f"model {plan.client_model!r} is not served by upstream {plan.upstream.name!r} "
            f"({exc.message}); its models: {named}",
            status=404,
            upstream_status=exc.upstream_status,
        )

    def shadow_meter(self, scenario: str, evidence: Mapping[str, Any] | None) -> LearningMeter:
        """The learning meter of ``scenario``'s shadow calls: its ``learning_budget`` and
        the recipe budgets in the candidate's ``evidence`` (``reef.gateway.shadow``)."""
        budgets = [(f"scenario:{scenario}", self.state.settings.scenario(scenario).learning_budget)]
        for scope, limits in shadow_budgets(evidence):
            try:
                budgets.append((scope, [LearningBudgetLimit.model_validate(x) for x in limits]))
            except ValueError:  # evidence the gate wrote from another version: skipped
                log.warning("shadow: a learning budget of %s does not validate", scope)
        spend = self.state.spend
        return LearningMeter(self.state.database, budgets, lambda: spend.clock(), scenario)

    async def shadow_call(
        self, exchange: Exchange, request: Request, serving: ServingRelease, max_tokens: int
    ) -> tuple[Any, Price | None] | None:
        """Ask ``serving`` (a candidate) the live ``exchange``'s request as one
        non-streaming call capped at ``max_tokens``, and record the answer with purpose
        ``shadow`` (``reef.gateway.shadow``); the answer's usage and price, None when no
        answer came."""
        body = shadow_body(exchange.api, exchange.body, max_tokens)
        source, rendered = self._outgoing(exchange.api, body, None, exchange.scenario, serving)
        requested = body.get("model")
        plan = self._plan(exchange.api, rendered, request, serving, requested)
        tags = {**exchange.headers.tags, SHADOW_OF_TAG: exchange.record_id}
        shadow = replace(
            exchange,
            record_id=new_id(),
            session_id=new_id(),
            session_is_new=True,
            release_id=serving.release_id,
            serving=serving,
            weights_digest=self.state.activation.verified_digest(serving),
            rendered=rendered if rendered is not source else None,
            headers=replace(exchange.headers, idempotency_key=None, tags=tags),
            body=body,
            purpose="shadow",
            pending=False,
            started=time.perf_counter(),
            # The candidate's model's price; Reef's own spend (a learning meter counts
            # it, reef.gateway.shadow), never held against a client's budget.
            price=self.state.spend.price_for(
                exchange.scenario, serving.base_model, requested, plan.model_from_client
            ),
            charge=None,
            outcome=None,  # the candidate answers alone: the live routing is not its
        )
        recorder = self.state.recorder
        try:
            answer = await plan.upstream.send(plan.request)
            data = orjson.loads(answer.body)
            if not isinstance(data, dict):
                raise UpstreamMalformedError("upstream sent a JSON document that is not an object")
        except (UpstreamError, orjson.JSONDecodeError) as exc:
            detail = exc.detail if isinstance(exc, UpstreamError) else f"invalid JSON: {exc}"
            draft = recorder.draft(shadow, None, None, "error", detail)
            await recorder.record(replace(draft, continuation_hash=None))
            return None
        await self._used(shadow, data)  # counted under purpose ``shadow`` in /metrics
        usage = data.get("usage")
        _, data, reply = self._answered(shadow, plan, answer.body, data)
        draft = recorder.draft(shadow, data, reply, "ok", None)
        # No later turn continues a shadow answer: it never joins a live session.
        await recorder.record(replace(draft, continuation_hash=None))
        return usage, shadow.price

    def _observe(self, exchange: Exchange, status: int) -> None:
        elapsed = time.perf_counter() - exchange.started
        self.state.metrics.observe(_ROUTES[exchange.api], status, elapsed)

    async def _complete(
        self, exchange: Exchange, plan: CallPlan, dialect: ErrorDialect
    ) -> Response:
        try:
            answer, data = await self._ask(plan)
            if plan.teacher is not None:  # the student answered first
                plan, answer, data = await self._checked(exchange, plan, answer, data)
        except UpstreamError as exc:
            return await self._fail(exchange, plan, exc, dialect)
        await self._used(exchange, data)
        payload, data, reply = self._answered(exchange, plan, answer.body, data)
        if plan.logprobs_kept:  # the teacher's, for the record: not the client's
            payload = dumps(without_logprobs(data, as_null=True))
            data = self._kept_logprobs(data)
        if exchange.capture:
            recorder = self.state.recorder
            recorded = data
            if exchange.api == "openai.embeddings" and not exchange.replayable:
                recorded = embeddings_for_record(data)
            draft = recorder.draft(exchange, recorded, reply, "ok", None)
            if exchange.responses is not None:
                kept = response_to_keep(exchange, data, recorder.redactor)
                draft = replace(draft, kept_response=kept)
            first = await recorder.record_first(draft)
            if first != draft.id:
                return await self._answer_first(exchange, first, dialect)
        self._observe(exchange, answer.status)
        return Response(
            payload,
            status_code=answer.status,
            media_type="application/json",
            headers=self._receipt(exchange),
        )

    def _kept_logprobs(self, data: dict[str, Any]) -> dict[str, Any]:
        """The teacher's answer as recorded for logit distillation: with its logprobs,
        unless ``capture.redact_patterns`` redacts something in it. Redaction works on
        whole strings, and a match split over the logprobs' tokens would escape it."""
        bare = without_logprobs(data, as_null=True)
        if self.state.recorder.redactor.redact(bare) != bare:
            return bare
        return data

    async def _ask(self, plan: CallPlan) -> tuple[UpstreamResponse, dict[str, Any]]:
        """``plan``'s upstream answer and its parsed JSON object."""
        answer = await self.state.shutdown.until_cut(plan.upstream.send, plan.request)
        try:
            data = orjson.loads(answer.body)
        except orjson.JSONDecodeError as exc:
            raise UpstreamMalformedError(f"upstream sent invalid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise UpstreamMalformedError("upstream sent a JSON document that is not an object")
        return answer, data

    async def _checked(
        self, exchange: Exchange, plan: CallPlan, answer: UpstreamResponse, data: dict[str, Any]
    ) -> tuple[CallPlan, UpstreamResponse, dict[str, Any]]:
        """The student's answer when no escalation rule fires on it (without the
        logprobs asked for the rule), else the teacher's, asked now: nothing has reached
        the client yet. The plan returned is the one whose answer it is."""
        routing = exchange.serving.routing
        teacher = plan.teacher
        assert routing is not None and teacher is not None
        sent = orjson.loads(plan.request.body)
        reply = reply_of(data)
        rule = escalation_rule(routing.escalation, sent, reply)
        if rule is None:
            exchange.outcome = RoutingOutcome("student", mean_logprob=reply.mean_logprob)
            if plan.logprobs_added:
                data = without_logprobs(data)
                answer = replace(answer, body=dumps(data))
            return plan, answer, data
        tokens = usage_tokens(data.get("usage"))
        price = exchange.price
        cost = price.cost(tokens) if price is not None and tokens is not None else None
        self.state.spend.count(exchange.scenario, exchange.purpose, tokens, cost)
        exchange.outcome = RoutingOutcome(
            "teacher",
            rule,
            student_attempt={
                "response": without_logprobs(data) if plan.logprobs_added else data,
                "cost": cost,
                "price": price.as_dict() if price is not None else None,
            },
            student_tokens=tokens,
            student_cost=cost,
            mean_logprob=reply.mean_logprob,
        )
        exchange.price = self.state.spend.price_at(routing.teacher.upstream, routing.teacher.model)
        answer, data = await self._ask(teacher)
        return teacher, answer, data

    def _answered(
        self, exchange: Exchange, plan: CallPlan, body: bytes, data: dict[str, Any]
    ) -> tuple[bytes, dict[str, Any], dict[str, Any] | None]:
        """What the client gets of a complete answer (``body``, parsed: ``data``), the
        response in the client's dialect, and its canonical reply (none for vectors)."""
        if exchange.responses is not None:
            if plan.native:  # the upstream's own response, under Reef's id
                data = {**data, "id": exchange.responses.response_id}
            elif plan.on_anthropic:
                data = anthropic_response_to_openai(data)
                data = openai_response_to_responses(data, exchange.responses.shell)
            else:
                data = openai_response_to_responses(data, exchange.responses.shell)
            return dumps(data), data, canonical_reply_responses(data)
        if plan.translate:
            reply = canonical_reply_openai(data)
            data = openai_response_to_anthropic(data, plan.client_model)
            return dumps(data), data, reply
        if exchange.api == "openai.chat":
            return body, data, canonical_reply_openai(data)
        if exchange.api == "openai.completions":
            return body, data, canonical_reply_completions(data, exchange.body)
        if exchange.api == "openai.embeddings":
            return body, data, None  # a vector is no reply to learn from
        return body, data, canonical_reply_anthropic(data)

    async def _answer_first(
        self, exchange: Exchange, record_id: str, dialect: ErrorDialect
    ) -> Response:
        """Another gateway on this store answered the idempotency key first (its record
        is ``record_id``): answer as it did, so the receipt names the stored record."""
        try:
            answer = self._replay(exchange, await self.state.recorder.stored(record_id))
        except ReefError as exc:
            response = error_response(exc, dialect)
            self._observe(exchange, response.status_code)
            return response
        self._observe(exchange, answer.status)
        return answer.response()

    async def _stream(
        self,
        exchange: Exchange,
        plan: CallPlan,
        dialect: ErrorDialect,
        held: _Held,
        lead: Lead | None,
    ) -> Response:
        try:
            stream = await self.state.shutdown.until_cut(plan.upstream.open_stream, plan.request)
            if plan.teacher is not None:  # the student answers first
                plan, stream = await self._committed_stream(exchange, plan, stream)
        except UpstreamError as exc:
            return await self._fail(exchange, plan, exc, dialect)
        if exchange.capture:
            try:
                await self.state.recorder.record_pending(exchange)
            except BaseException:
                await stream.aclose()
                raise
        headers = {**self._receipt(exchange), "cache-control": "no-cache"}
        on_end = None
        if lead is not None:
            on_end = functools.partial(self._streamed, lead, headers)
        departure = _Departure()
        relay = self._relay(exchange, plan, stream, dialect, departure)
        body = _ClientBody(relay, on_end, departure)
        held.push_async_callback(self._close_body, body, exchange, stream)
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)

    async def _committed_stream(
        self, exchange: Exchange, plan: CallPlan, stream: UpstreamStream
    ) -> tuple[CallPlan, UpstreamStream]:
        """The student's stream, committed to: at once when the release buffers no
        tokens, else once its first ``stream_buffer_tokens`` pass the rules (they are
        sent first). When a rule fires on them the student's stream is closed and the
        teacher's opened instead: nothing has reached the client yet."""
        routing = exchange.serving.routing
        teacher = plan.teacher
        assert routing is not None and teacher is not None
        buffer = routing.escalation.stream_buffer_tokens
        if buffer == 0:
            exchange.outcome = RoutingOutcome("student")
            return plan, stream
        peek = StreamPeek("responses" if plan.native else plan.upstream.dialect)
        chunks = aiter(stream)
        read: list[bytes] = []
        try:
            while peek.tokens < buffer and not peek.ended:
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    peek.ended = True
                    break
                read.append(chunk)
                peek.feed(chunk)
        except BaseException:
            await stream.aclose()
            raise
        reply = peek.reply()
        rule = escalation_rule(routing.escalation, orjson.loads(plan.request.body), reply)
        if rule is None:
            exchange.outcome = RoutingOutcome("student")
            return plan, ResumedStream(stream, chunks, read)
        await stream.aclose()
        attempt = {
            "text": reply.text,
            "tool_calls": [{"name": name, "arguments": args} for name, args in reply.calls],
            "complete": reply.complete,
            "tokens_read": peek.tokens,
        }
        exchange.outcome = RoutingOutcome("teacher", rule, student_attempt=attempt)
        exchange.price = self.state.spend.price_at(routing.teacher.upstream, routing.teacher.model)
        opened = await self.state.shutdown.until_cut(teacher.upstream.open_stream, teacher.request)
        return teacher, opened

    def _streamed(self, lead: Lead, headers: dict[str, str], sent: bytes) -> None:
        """A stream under an idempotency key ended: its waiters get the same events."""
        lead.settle(Answer(200, "text/event-stream", headers, sent), self._committed())

    async def _close_body(
        self, body: _ClientBody, exchange: Exchange, stream: UpstreamStream
    ) -> None:
        """After the response: end a relay the client left (its own ``finally`` records
        ``aborted``), or, when the client left before asking for a byte and the relay
        never ran, close the upstream and record ``aborted`` here."""
        await body.aclose()  # a relay never started never runs now
        if body.started:
            return
        task = asyncio.get_running_loop().create_task(stream.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        if exchange.capture:
            recorder = self.state.recorder
            reason = "client disconnected before the first byte"
            recorder.record_in_background(recorder.draft(exchange, None, None, "aborted", reason))
        self._observe(exchange, 499)

    async def _relay(  # noqa: C901
        self,
        exchange: Exchange,
        plan: CallPlan,
        stream: UpstreamStream,
        dialect: ErrorDialect,
        departure: _Departure,
    ) -> AsyncIterator[bytes]:
        """Relay the upstream's events while reassembling the full response for the record.

        When the client goes away the surrounding task is cancelled; the ``finally`` block
        then may not await, so it closes the upstream and records ``aborted`` through
        tasks of their own. When the gateway stops (``GatewayState.shutdown``), the
        stream ends with an error event and is recorded ``aborted`` with
        ``interrupted: the gateway stopped``. A stream whose every byte was ready at once
        can run to its end before that cancellation lands, so the end checks
        ``departure`` before it records ``ok``: a client seen gone gets ``aborted``.
        """
        relay = self._stream_relay(exchange, plan)
        relay.parser.max_line_bytes = stream.max_line_bytes  # the upstream's bound
        recorder = self.state.recorder
        shutdown = self.state.shutdown
        watch = shutdown.watch()
        recorded = False
        cut = False
        try:
            chunks = aiter(stream)
            while True:
                if shutdown.cutting:
                    cut = True
                    break
                watch.reading = True
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except asyncio.CancelledError:
                    if not shutdown.is_cut(watch):
                        raise
                    # The gateway's own cut, not the client leaving: take it back and
                    # end the stream properly below.
                    task = asyncio.current_task()
                    if task is not None:
                        task.uncancel()
                    cut = True
                    break
                finally:
                    watch.reading = False
                out = relay.feed(chunk)
                if out:
                    yield out
            if cut:
                raise GatewayStoppedError
            tail = relay.finish()
            if tail:
                yield tail
            if departure.left:
                return  # nobody read it: the ``finally`` records ``aborted``
            recorded = True
            response, reply = relay.result()
            await self._used(exchange, response)
            if exchange.capture:
                draft = recorder.draft(exchange, response, reply, "ok", None)
                if exchange.responses is not None:
                    kept = response_to_keep(exchange, response, recorder.redactor)
                    draft = replace(draft, kept_response=kept)
                # Shielded: a client leaving now must not lose (or duplicate) the record.
                await asyncio.shield(recorder.record(draft))
            # The end-of-stream event goes out only now, so a client that has seen the
            # whole stream can rely on the record (sync durability).
            if relay.terminal:
                yield relay.terminal
            self._observe(exchange, 200)
        except UpstreamError as exc:
            stopped = isinstance(exc, GatewayStoppedError)
            if not stopped:
                self.state.metrics.upstream_errors.labels(
                    plan.upstream.name, type(exc).__name__
                ).inc()
            recorded = True
            failure = relay.failure(exc, error_event(exc, dialect))
            if exchange.capture:
                response, _ = relay.result()
                draft = recorder.draft(
                    exchange, response, None, "aborted" if stopped else "error", exc.detail
                )
                await asyncio.shield(recorder.record(draft))
            self._observe(exchange, exc.status)
            yield failure
        finally:
            shutdown.release(watch)
            if not recorded:
                asyncio.get_running_loop().create_task(stream.aclose())
                if exchange.capture:
                    response, _ = relay.result()
                    # A client leaving while the gateway stops (its last writes cut
                    # short) is still the stop's doing.
                    reason = STOPPED if shutdown.cutting else departure.reason()
                    draft = recorder.draft(exchange, response, None, "aborted", reason)
                    recorder.record_in_background(draft)
                self._observe(exchange, 499)
        await stream.aclose()

    def _stream_relay(self, exchange: Exchange, plan: CallPlan) -> StreamRelay:
        """The relay that takes ``exchange``'s stream to its client
        (``reef.upstream.relay``, ``reef.upstream.responses.relay``)."""
        if exchange.responses is not None:
            receipt = stream_receipt(self._receipt(exchange))
            if plan.native:
                return NativeResponsesRelay(exchange.responses.response_id, receipt)
            if plan.on_anthropic:
                return AnthropicResponsesRelay(exchange.responses.shell, receipt)
            return ResponsesRelay(exchange.responses.shell, receipt)
        if exchange.api == "openai.completions":
            return CompletionsRelay(plan.strip_usage, exchange.body)
        if exchange.api == "openai.chat":
            return OpenAIRelay(plan.strip_usage)
        return TranslatedRelay(plan.client_model) if plan.translate else AnthropicRelay()


class _Held:
    """What one request holds until its response is done (``InferenceRoutes.serve``):
    an exit stack, made only for the first thing held, since most requests (no
    adapter, no idempotency key, not a stream) hold nothing."""

    __slots__ = ("_stack", "shadow")

    def __init__(self) -> None:
        self._stack: AsyncExitStack | None = None
        self.shadow: Exchange | None = None  # the live exchange to offer the shadow arm

    def _opened(self) -> AsyncExitStack:
        if self._stack is None:
            self._stack = AsyncExitStack()
        return self._stack

    def enter_context(self, context: AbstractContextManager[_T]) -> _T:
        """Enter ``context``; it exits when the response is done."""
        return self._opened().enter_context(context)

    def push_async_callback(
        self, callback: Callable[..., Awaitable[object]], /, *args: Any
    ) -> None:
        """Await ``callback(*args)`` when the response is done."""
        self._opened().push_async_callback(callback, *args)

    async def __aenter__(self) -> _Held:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._stack is None:
            return False
        return bool(await self._stack.__aexit__(exc_type, exc, tb))


class _Departure:
    """Whether a stream's client has gone, and how many chunks had been handed to the
    server by then. An ASGI 2.3 server says so on ``receive`` (which Starlette's streaming
    response watches); an ASGI 2.4 one raises on ``send``, which ends the relay itself."""

    __slots__ = ("_delivered_when_left", "delivered", "left")

    def __init__(self) -> None:
        self.delivered = 0
        self.left = False
        self._delivered_when_left = 0

    def watch(self, receive: Receive) -> Receive:
        """``receive``, noting the disconnect when it reports one."""

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not self.left:
                self.left = True
                self._delivered_when_left = self.delivered
            return message

        return receiving

    def reason(self) -> str:
        """The ``aborted`` record's error: whether the client left before the first byte."""
        if self.left and self._delivered_when_left == 0:
            return "client disconnected before the first byte"
        return "client disconnected mid-stream"


class _ClientBody:
    """A stream's bytes on their way to the client. Notes whether the client ever asked
    for one (a relay never started has nothing to clean up by itself) and, for an
    idempotency key's waiters, keeps a copy that ``on_end`` gets once the stream ended."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        on_end: Callable[[bytes], None] | None,
        departure: _Departure,
    ) -> None:
        self._chunks = chunks
        self.departure = departure
        self._on_end = on_end
        self._sent: list[bytes] | None = [] if on_end is not None else None
        self.started = False

    def __aiter__(self) -> _ClientBody:
        return self

    async def __anext__(self) -> bytes:
        self.started = True
        try:
            chunk = await anext(self._chunks)
        except StopAsyncIteration:
            # A stream cut by the client's departure is no answer to hand to waiters.
            if self._on_end is not None and self._sent is not None and not self.departure.left:
                on_end, self._on_end = self._on_end, None
                on_end(b"".join(self._sent))
            raise
        if self._sent is not None:
            self._sent.append(chunk)
        self.departure.delivered += 1
        return chunk

    async def aclose(self) -> None:
        """Close the relay (a no-op once it ended)."""
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()


def _with_logprobs(plan: CallPlan, rendered: dict[str, Any], top: int = 0) -> CallPlan:
    """``plan`` asking its upstream for token logprobs (and ``top`` alternatives per
    token, when above 0) that the client did not ask for, marked ``logprobs_added``;
    unchanged when the client asked for them itself, for a stream, or for an upstream
    that is not OpenAI-compatible."""
    if plan.upstream.dialect != "openai" or plan.request.stream or asked_logprobs(rendered):
        return plan
    out = {**orjson.loads(plan.request.body), "logprobs": True}
    if top:
        out["top_logprobs"] = top
    return replace(plan, request=replace(plan.request, body=dumps(out)), logprobs_added=True)


def shadow_body(api: Api, body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """A live request as its shadow call: not streamed, its reply capped at
    ``max_tokens`` (the client's own cap when lower)."""
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    fields = ["max_tokens"]
    if api != "anthropic.messages":
        fields.append("max_completion_tokens")
    capped = False
    for name in fields:
        value = out.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = min(value, max_tokens)
            capped = True
    if not capped:
        out["max_tokens"] = max_tokens
    return out

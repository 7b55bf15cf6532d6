"""``POST /v1/messages/count_tokens``: Anthropic's token count, by the scenario's upstream.

An Anthropic upstream counts itself: the request is relayed with the scenario's model.
An OpenAI-compatible upstream that tokenizes chats (the embedded engine; vLLM) counts
the request's chat-completions translation, the very messages a ``/v1/messages`` call
would send it, with its own tokenizer and chat template (``POST /tokenize``). Any other
upstream is a 501 saying so. Nothing is recorded: a count is no exchange.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps
from reef.core.errors import InvalidInputError
from reef.gateway.auth import grant_of
from reef.gateway.body_checks import check_anthropic_messages
from reef.gateway.requests import (
    SCENARIO_MODEL_PREFIX,
    check_known_scenario,
    read_json_object,
    reef_headers,
)
from reef.gateway.state import GatewayState
from reef.upstream import (
    UpstreamRequest,
    UpstreamUnsupportedError,
    anthropic_request_to_openai,
)

_FORWARDED_ANTHROPIC_HEADERS = ("anthropic-beta", "anthropic-version")


class TokenCountRoutes:
    """``POST /v1/messages/count_tokens`` (errors in Anthropic's shape)."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def count_tokens(self, request: Request) -> Response:
        """``{"input_tokens": n}`` for a Messages body, as the scenario's upstream counts
        it. Raises ``UpstreamUnsupportedError`` (501) for an upstream that cannot."""
        state = self.state
        grant = grant_of(request)
        body = await read_json_object(request, state.settings.server.max_body_bytes)
        check_anthropic_messages(body)
        scenario = reef_headers(request, body, state.model_aliases).scenario
        grant.check_scenario(scenario)
        server = state.settings.server
        check_known_scenario(
            scenario, state.settings.scenarios, server.unknown_scenarios, grant.visible
        )
        upstream_name, config = state.settings.upstream_for(scenario)
        upstream = state.upstreams[upstream_name]
        serving = await state.activation.current(scenario)
        configured = state.settings.scenario(scenario).model or serving.base_model or config.model
        model = self._model(body, scenario, upstream_name, configured)
        if upstream.dialect == "anthropic":
            forwarded = {
                name: value
                for name in _FORWARDED_ANTHROPIC_HEADERS
                if (value := request.headers.get(name)) is not None
            }
            relayed = {**body, "model": model}
            answer = await upstream.send(
                UpstreamRequest("/messages/count_tokens", dumps(relayed), False, forwarded)
            )
            return Response(answer.body, answer.status, media_type="application/json")
        chat = anthropic_request_to_openai(body, model)
        conversation = {"model": model, "messages": chat["messages"]}
        if chat.get("tools"):
            conversation["tools"] = chat["tools"]
        try:
            count = await upstream.count_chat_tokens(dumps(conversation))
        except UpstreamUnsupportedError as exc:
            raise UpstreamUnsupportedError(
                f"scenario {scenario!r} is served by upstream {upstream_name!r}, which cannot "
                f"count tokens ({exc.message}): POST /v1/messages/count_tokens is relayed to "
                "Anthropic upstreams and counted by the tokenizer of the embedded engine "
                "(or vLLM, POST /tokenize)",
                exc.upstream_status,
            ) from exc
        return Response(dumps({"input_tokens": count}), media_type="application/json")

    def _model(
        self, body: dict[str, object], scenario: str, upstream_name: str, configured: str | None
    ) -> str:
        """The model that counts: the scenario's ``configured`` one, else the client's
        own name (never ``reef/<scenario>`` or an alias); ``InvalidInputError`` without."""
        if configured:
            return configured
        requested = body.get("model")
        if (
            not isinstance(requested, str)
            or not requested
            or requested.startswith(SCENARIO_MODEL_PREFIX)
            or requested in self.state.model_aliases
        ):
            raise InvalidInputError(
                f"scenario {scenario!r} has no model configured: set "
                f"scenarios.{scenario}.model or upstreams.{upstream_name}.model, "
                "or send an upstream model name"
            )
        return requested

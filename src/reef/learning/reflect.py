"""``UpstreamReflector``: one chat completion from a configured upstream, for reflective
learners (``Reflector``) and for scorers that ask a model (``UpstreamModels``).

It posts to the scenario's upstream (``settings.upstream_for(scenario)``) with the
scenario's model through ``reef.upstream`` (the same client, timeouts, retries and
credentials as the gateway's): the OpenAI dialect (``/chat/completions``) or
Anthropic's (``/messages``). A ``local`` upstream has no URL in the config (``reef
serve`` starts it), so the worker passes the engine's base URL in ``base_url``.

Blocking on purpose: learners run in worker threads, not an event loop, so each call
runs the async client on a short event loop of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Mapping
from typing import Any

import orjson

from reef.config import ReefSettings
from reef.config.models import UpstreamConfig
from reef.core import dumps
from reef.core.errors import ReefError
from reef.core.prices import Price
from reef.experience import LearningMeter, price_of
from reef.upstream import HTTPUpstream, UpstreamError, UpstreamRequest


class ReflectError(ReefError):
    """The reflector model could not be asked, or answered with no text."""


class UpstreamReflector:
    """A ``Reflector`` on ``scenario``'s own upstream and model, unless ``upstream_name``
    (a configured upstream) or ``model`` name another; ``base_url`` overrides the
    upstream's URL. Raises ``ReflectError`` for an upstream that is not configured."""

    def __init__(
        self,
        settings: ReefSettings,
        scenario: str,
        base_url: str | None = None,
        max_tokens: int = 1024,
        upstream_name: str | None = None,
        model: str | None = None,
    ) -> None:
        if upstream_name is not None:
            if upstream_name not in settings.upstreams:
                raise ReflectError(
                    f"reflector upstream {upstream_name!r} is not configured; "
                    f"configured upstreams: {sorted(settings.upstreams)}"
                )
            name, upstream = upstream_name, settings.upstreams[upstream_name]
            default_model = upstream.model
        else:
            name, upstream = settings.upstream_for(scenario)
            default_model = settings.scenario(scenario).model or upstream.model
        self.scenario = scenario
        self.upstream_name = name
        self.url = (base_url or upstream.base_url or "").rstrip("/")
        self.model = model or default_model or scenario
        self.max_tokens = max_tokens
        # A ``local`` upstream is the embedded engine: OpenAI-compatible at the given URL.
        kind = "openai" if upstream.type == "local" else upstream.type
        self._config = upstream.model_copy(update={"base_url": self.url, "type": kind})
        # Reef's own spend: admitted and counted as ``purpose`` (``metered``).
        self.meter: LearningMeter | None = None
        self.purpose = "reflect"
        # The usage and price of the last call (a judge's call record keeps them).
        self.last_call: tuple[Any, Price | None] = (None, None)

    def metered(self, meter: LearningMeter | None, purpose: str) -> UpstreamReflector:
        """This reflector, its calls admitted by and counted in ``meter`` as
        ``purpose`` (``reef.experience.learning_spend``)."""
        self.meter = meter
        self.purpose = purpose
        return self

    def reflect(self, messages: list[dict[str, Any]]) -> str:
        """The model's reply text; ``ReflectError`` when there is no URL to ask, the call
        fails or the reply has no text."""
        if not self.url:
            raise ReflectError(
                f"upstream {self.upstream_name!r} of scenario {self.scenario!r} has no "
                "base_url to reflect with (a `local` upstream needs the worker's base URL "
                "override)"
            )
        if self.dialect == "anthropic":
            body = _anthropic_request(messages, self.model, self.max_tokens)
            return _anthropic_text(self.complete("/messages", body))
        body = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens}
        return _openai_text(self.complete("/chat/completions", body))

    @property
    def dialect(self) -> str:
        """``anthropic`` or ``openai``: what ``complete`` must be sent."""
        return "anthropic" if self._config.type == "anthropic" else "openai"

    def complete(self, path: str, body: dict[str, Any]) -> Any:
        """``body`` posted to ``path`` of the upstream as one non-streaming call, admitted
        and charged on the meter (``metered``); the decoded answer. ``ReflectError``
        when there is no URL, or the call fails or answers with invalid JSON."""
        if not self.url:
            raise ReflectError(
                f"upstream {self.upstream_name!r} of scenario {self.scenario!r} has no "
                "base_url to call (a `local` upstream needs the worker's base URL override)"
            )
        if self.meter is not None:
            self.meter.admit(self.purpose)
        reply = _blocking(_ask(self.upstream_name, self._config, path, body))
        usage = reply.get("usage") if isinstance(reply, dict) else None
        self.last_call = (usage, price_of(self._config.prices, self.model))
        if self.meter is not None:
            self.meter.charge(self.purpose, *self.last_call)
        return reply


class UpstreamModels:
    """The configured models of ``scenario``, for scorers (``reef.evaluation``'s
    ``ConfiguredModel``): each ``ask`` goes to the upstream and model it names, by
    default the scenario's own; ``base_urls`` gives URLs by upstream name (the
    ``local`` upstream has none in the config); with ``meter``, each call is admitted
    and counted as ``purpose`` (``reef.experience.learning_spend``)."""

    def __init__(
        self,
        settings: ReefSettings,
        scenario: str,
        base_urls: Mapping[str, str] | None = None,
        meter: LearningMeter | None = None,
        purpose: str = "judge",
    ) -> None:
        self.settings = settings
        self.scenario = scenario
        self.base_urls = dict(base_urls or {})
        self.meter = meter  # Reef's own spend, counted as ``purpose``
        self.purpose = purpose
        self.last_call: tuple[Any, Price | None] = (None, None)  # usage and price

    def ask(
        self, messages: list[dict[str, Any]], upstream: str | None = None, model: str | None = None
    ) -> str:
        """The reply text of ``model`` on ``upstream`` (None: the scenario's own) to
        ``messages``; raises ``ReflectError`` as ``UpstreamReflector`` does."""
        reflector = self._reflector(upstream, model)
        try:
            return reflector.reflect(messages)
        finally:
            self.last_call = reflector.last_call

    def model_name(self, upstream: str | None = None, model: str | None = None) -> str:
        """The model ``ask`` would call for these arguments."""
        return self._reflector(upstream, model).model

    def _reflector(self, upstream: str | None, model: str | None) -> UpstreamReflector:
        name = upstream or self.settings.upstream_for(self.scenario)[0]
        return UpstreamReflector(
            self.settings,
            self.scenario,
            base_url=self.base_urls.get(name),
            upstream_name=upstream,
            model=model,
        ).metered(self.meter, self.purpose)


def _blocking(call: Coroutine[Any, Any, Any]) -> Any:
    """Run ``call`` to its end from synchronous code: on an event loop of its own, in
    another thread when this one already runs a loop (a caller inside async code)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reef-reflect") as pool:
        return pool.submit(asyncio.run, call).result()


async def _ask(name: str, config: UpstreamConfig, path: str, body: dict[str, Any]) -> Any:
    """One non-streaming call on a client made for this event loop."""
    upstream = HTTPUpstream(name, config)
    where = f"{config.base_url}{path}"
    try:
        answer = await upstream.send(UpstreamRequest(path, dumps(body), stream=False))
    except UpstreamError as error:
        raise ReflectError(f"reflector at {where}: {error.message}") from error
    finally:
        await upstream.aclose()
    try:
        return orjson.loads(answer.body)
    except orjson.JSONDecodeError as error:
        raise ReflectError(f"reflector at {where} answered with invalid JSON") from error


def _anthropic_request(
    messages: list[dict[str, Any]], model: str, max_tokens: int
) -> dict[str, Any]:
    system = "\n\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
    rest = [m for m in messages if m.get("role") != "system"]
    body: dict[str, Any] = {"model": model, "messages": rest, "max_tokens": max_tokens}
    if system:
        body["system"] = system
    return body


def _openai_text(reply: Any) -> str:
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as error:
        raise ReflectError("reflector reply has no choices[0].message.content") from error
    if not isinstance(content, str):
        raise ReflectError("reflector reply has no text content")
    return content


def _anthropic_text(reply: Any) -> str:
    try:
        blocks = reply["content"]
        text = "".join(b["text"] for b in blocks if b.get("type") == "text")
    except (KeyError, TypeError) as error:
        raise ReflectError("reflector reply has no text content blocks") from error
    return text

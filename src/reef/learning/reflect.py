"""``reflect``: one chat completion from a scenario's upstream, for reflective learners.

The worker hands learners ``LearnerContext.reflect(messages) -> str``. It posts to the
scenario's upstream (``settings.upstream_for(scenario)``) with the scenario's model: the
OpenAI dialect (``{base_url}/chat/completions``) or Anthropic's (``{base_url}/messages``).
A ``local`` upstream has no URL in the config (``reef serve`` starts it), so the worker
passes the engine's base URL in ``base_url``.

Blocking and stdlib-only on purpose: learners run in worker threads, not an event loop.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from reef.config import ReefSettings
from reef.core.errors import ReefError

Reflect = Callable[[list[dict[str, Any]]], str]


class ReflectError(ReefError):
    """The reflector model could not be asked, or answered with no text."""


def make_reflect(
    settings: ReefSettings,
    scenario: str,
    base_url: str | None = None,
    max_tokens: int = 1024,
    upstream_name: str | None = None,
    model: str | None = None,
) -> Reflect:
    """A ``reflect`` callable for ``scenario``: its own upstream and model unless
    ``upstream_name`` (a configured upstream) or ``model`` name another reflector;
    ``base_url`` overrides the upstream's URL."""
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
    url = (base_url or upstream.base_url or "").rstrip("/")
    model = model or default_model or scenario
    key = upstream.api_key.get_secret_value() if upstream.api_key else None
    timeout = upstream.total_timeout_seconds
    anthropic = upstream.type == "anthropic"

    def reflect(messages: list[dict[str, Any]]) -> str:
        if not url:
            raise ReflectError(
                f"upstream {name!r} of scenario {scenario!r} has no base_url to reflect with "
                "(a `local` upstream needs the worker's base URL override)"
            )
        if anthropic:
            body, headers = _anthropic_request(messages, model, max_tokens, key)
            headers["anthropic-version"] = upstream.anthropic_version
            reply = _post(f"{url}/messages", body, headers, timeout)
            return _anthropic_text(reply)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": model, "messages": messages, "max_tokens": max_tokens}
        reply = _post(f"{url}/chat/completions", body, headers, timeout)
        return _openai_text(reply)

    return reflect


def _anthropic_request(
    messages: list[dict[str, Any]], model: str, max_tokens: int, key: str | None
) -> tuple[dict[str, Any], dict[str, str]]:
    system = "\n\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
    rest = [m for m in messages if m.get("role") != "system"]
    body: dict[str, Any] = {"model": model, "messages": rest, "max_tokens": max_tokens}
    if system:
        body["system"] = system
    headers = {"x-api-key": key} if key else {}
    return body, headers


def _post(url: str, body: dict[str, Any], headers: dict[str, str], timeout: float) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:500]
        raise ReflectError(f"reflector at {url} answered {error.code}: {detail}") from error
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        raise ReflectError(f"reflector at {url} unreachable: {error}") from error
    except ValueError as error:
        raise ReflectError(f"reflector at {url} answered with invalid JSON") from error


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

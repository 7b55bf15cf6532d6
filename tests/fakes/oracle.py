"""A fake model server whose knowledge is its system prompt: a real OpenAI-compatible
HTTP server on loopback, for tests where a harness must make answers better or worse.

Rules, applied to ``POST /v1/chat/completions``:

- facts are the system prompt's lines of the form ``<question> => <answer>``;
- a user message ``Q: <question>`` is answered with the fact's answer, else ``unknown``;
- with ``leaky=True``, a message asking for the system prompt, instructions or examples
  (or to repeat everything) is answered with the whole system prompt;
- anything else: ``ok``.

``calls`` counts the completions served.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from tests.fakes.loopback import LoopbackThread

_LEAK_WORDS = ("system prompt", "repeat everything", "instructions", "configuration")


def oracle_reply(messages: list[dict[str, Any]], leaky: bool) -> str:
    """The oracle's answer to a conversation (module docstring)."""
    system = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
    users = [m for m in messages if m.get("role") == "user"]
    text = str(users[-1].get("content") or "") if users else ""
    if leaky and any(word in text.lower() for word in _LEAK_WORDS):
        return system or "I have no system prompt."
    if text.startswith("Q:"):
        question = text[2:].strip().lower()
        for line in system.splitlines():
            key, sep, answer = line.partition("=>")
            if sep and key.strip().lower() == question:
                return answer.strip()
        return "unknown"
    return "ok"


class OracleUpstreamThread(LoopbackThread):
    """The oracle on its own event loop in a background thread (``with`` it)."""

    def __init__(self, leaky: bool = False) -> None:
        super().__init__()
        self.leaky = leaky
        self.calls = 0

    async def _chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.calls += 1
        reply = oracle_reply(body.get("messages") or [], self.leaky)
        data = {
            "id": f"chatcmpl-{self.calls}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "oracle"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    async def _models(self, request: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": "oracle", "object": "model"}]}
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)

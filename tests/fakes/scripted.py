"""A fake chat model that plays a script: a real OpenAI-compatible server on loopback
whose replies to ``POST /v1/chat/completions`` are given in advance, for tests of agent
loops where ``FakeUpstream``'s rules (one weather call, then ``tool said: ...``) are
not enough.

Each script entry is the assistant ``message`` of one reply (``{"content": ...}`` or
``{"tool_calls": [...]}``; a tool call's ``arguments`` may be a dict, sent as JSON), or a
function of the request body returning one. When the script runs out every reply is
``{"content": "done"}``. ``requests`` and ``headers`` keep what each call sent, and every
reply carries ``x-reef-record-id: rec-<n>`` as the gateway's would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.loopback import LoopbackThread

Entry = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """One OpenAI tool call (``arguments`` a dict is sent as its JSON)."""
    text = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def calls(*entries: dict[str, Any]) -> dict[str, Any]:
    """An assistant message that makes ``entries`` (``tool_call``s)."""
    return {"content": None, "tool_calls": list(entries)}


class ScriptedChatThread(LoopbackThread):
    """The scripted model on its own event loop in a background thread (``with`` it)."""

    def __init__(self, script: Sequence[Entry] = ()) -> None:
        super().__init__()
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    async def _chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        entry: Entry = self.script.pop(0) if self.script else {"content": "done"}
        message = entry(body) if callable(entry) else entry
        reply = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls") is not None:
            reply["tool_calls"] = message["tool_calls"]
        data = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "scripted"),
            "choices": [
                {
                    "index": 0,
                    "message": reply,
                    "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        headers = {"x-reef-record-id": f"rec-{len(self.requests)}"}
        body_out = orjson.dumps(data)
        return web.Response(body=body_out, content_type="application/json", headers=headers)

"""A fake student model for distillation tests: a real OpenAI-compatible server on
loopback whose ``POST /v1/chat/completions`` answers ``student: <last user text>``, or,
chosen by a word in the last user text, the kind of answer an escalation rule catches:

- ``refuse``: "I'm sorry, but I can't help with that."; ``refusal-field``: the
  ``refusal`` field set; ``empty``: no content;
- ``unknown-tool``: a call of ``launch_rockets`` (never offered); ``bad-args``: a call of
  the first offered tool with ``{"city": 42}``; ``broken-args``: arguments that are not
  JSON; ``good-tool``: ``{"city": "Paris"}``;
- ``bad-json``: ``not json at all``; ``good-json``: ``{"answer": 42}``;
- ``unsure``: token logprobs of -5 (others -0.1), sent when the request asks for them.

After a tool result (the last message has role ``tool``) it answers ``student: tool
said: <result>``, or ``{"answer": "<result>"}`` when the request asks for JSON
(``response_format``), whatever the words: an agent's tool loop ends.

Streams (``stream: true``) send the same answer one word per chunk, then usage when
``stream_options.include_usage`` is set. Usage counts words. ``requests`` keeps every
request body.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.loopback import LoopbackThread

_WORDS = re.compile(r"\S+\s*")


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(str(part.get("text", "")) for part in content)
            return str(content or "")
    return ""


def _call(name: str, arguments: str) -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    return {
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": function}],
    }


# word in the last user text -> the student's message (``{tool}``: the first offered tool)
_ANSWERS: list[tuple[str, dict[str, Any]]] = [
    ("refusal-field", {"content": None, "refusal": "I will not do that."}),
    ("refuse", {"content": "I'm sorry, but I can't help with that."}),
    ("empty", {"content": ""}),
    ("unknown-tool", _call("launch_rockets", "{}")),
    ("bad-args", _call("{tool}", '{"city": 42}')),
    ("broken-args", _call("{tool}", '{"city": "Par')),
    ("good-tool", _call("{tool}", '{"city": "Paris"}')),
    ("bad-json", {"content": "not json at all"}),
    ("good-json", {"content": '{"answer": 42}'}),
]


def _tool_result(body: dict[str, Any]) -> str | None:
    """The text of the tool result that ends ``body``'s messages; None: it ends otherwise."""
    messages = body.get("messages") or []
    if not messages or messages[-1].get("role") != "tool":
        return None
    content = messages[-1].get("content")
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content)
    return str(content or "")


def student_message(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message the student answers ``body`` with."""
    result = _tool_result(body)
    if result is not None:
        if isinstance(body.get("response_format"), dict):
            return {"content": orjson.dumps({"answer": result}).decode()}
        return {"content": f"student: tool said: {result}"}
    text = _last_user_text(body)
    tools = body.get("tools") or []
    first_tool = tools[0]["function"]["name"] if tools else "none"
    for word, message in _ANSWERS:
        if word in text:
            return orjson.loads(orjson.dumps(message).replace(b"{tool}", first_tool.encode()))
    return {"content": f"student: {text}"}


class StudentThread(LoopbackThread):
    """The fake student on its own loop in a background thread (``with`` it)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        message = student_message(body)
        content = message.get("content") or ""
        words = _WORDS.findall(content)
        usage = {
            "prompt_tokens": len(_last_user_text(body).split()),
            "completion_tokens": max(len(words), 1),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        logprob = -5.0 if "unsure" in _last_user_text(body) else -0.1
        if body.get("stream"):
            return await self._stream(request, body, message, words, usage)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", **message},
            "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
        }
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [{"token": w, "logprob": logprob, "top_logprobs": []} for w in words]
            }
        data = {
            "id": f"chatcmpl-student-{len(self.requests)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model"),
            "choices": [choice],
            "usage": usage,
        }
        return web.json_response(data)

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        message: dict[str, Any],
        words: list[str],
        usage: dict[str, int],
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                "id": "chatcmpl-student-stream",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": body.get("model"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return b"data: " + orjson.dumps(data) + b"\n\n"

        await response.write(chunk({"role": "assistant", "content": ""}))
        for word in words:
            await response.write(chunk({"content": word}))
        for index, call in enumerate(message.get("tool_calls") or []):
            await response.write(chunk({"tool_calls": [{"index": index, **call}]}))
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        await response.write(chunk({}, finish))
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            tail = {
                "id": "chatcmpl-student-stream",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": body.get("model"),
                "choices": [],
                "usage": usage,
            }
            await response.write(b"data: " + orjson.dumps(tail) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

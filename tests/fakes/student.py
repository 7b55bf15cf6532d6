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

``POST /v1/completions`` answers a legacy text completion the same way from its prompt
(text only: ``refuse``, ``empty``, ``bad-json``, ``good-json``, ``unsure``), and
``POST /v1/responses`` (an upstream's own Responses API, for ``responses: native``) from
its last input item, the tool calls as ``function_call`` items and ``refusal-field`` as a
``refusal`` content part.

``POST /v1/messages`` answers the same in the Anthropic dialect (an Anthropic-compatible
student): text and ``tool_use`` blocks, ``refusal-field`` as ``stop_reason: refusal``,
``broken-args`` as an input that is not JSON in a stream (``partial_json``) and ``{}``
(missing the required field) in a whole message, which cannot carry one.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.loopback import LoopbackThread
from tests.fakes.responses_api import CREATED, item_text, last_input, responses_events
from tests.fakes.upstream import completion_chunks, text_completion

_WORDS = re.compile(r"\S+\s*")


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                if any(part.get("type") == "tool_result" for part in content):
                    continue  # an Anthropic tool result is a user message
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
    """The text of the tool result that ends ``body``'s messages (an OpenAI ``tool``
    message or an Anthropic ``tool_result`` block); None: they end otherwise."""
    messages = body.get("messages") or []
    if not messages:
        return None
    content = messages[-1].get("content")
    if messages[-1].get("role") == "user" and isinstance(content, list):
        results = [part for part in content if part.get("type") == "tool_result"]
        if not results:
            return None
        content = results[-1].get("content")
    elif messages[-1].get("role") != "tool":
        return None
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
    first_tool = (tools[0].get("function") or tools[0])["name"] if tools else "none"
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
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        """The same answers as an Anthropic message (or its stream of events)."""
        body = orjson.loads(await request.read())
        self.requests.append(body)
        answer = student_message(body)
        content: list[dict[str, Any]] = []
        arguments: list[str] = []  # each tool_use block's input as the stream sends it
        if answer.get("content"):
            content.append({"type": "text", "text": answer["content"]})
        for n, call in enumerate(answer.get("tool_calls") or []):
            function = call["function"]
            try:
                tool_input = orjson.loads(function["arguments"])
            except orjson.JSONDecodeError:
                tool_input = {}  # a whole message cannot carry input that is not JSON
            arguments.append(function["arguments"])
            block = {"type": "tool_use", "id": f"toolu_student{n}", "name": function["name"]}
            content.append({**block, "input": tool_input})
        stop = "tool_use" if arguments else "end_turn"
        if answer.get("refusal"):
            stop = "refusal"
        words = _WORDS.findall(answer.get("content") or "")
        message = {
            "id": f"msg_student{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": len(_last_user_text(body).split()),
                "output_tokens": max(len(words), 1),
            },
        }
        if not body.get("stream"):
            return web.json_response(message)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def event(name: str, data: dict[str, Any]) -> None:
            data = {"type": name, **data}
            await response.write(f"event: {name}\ndata: ".encode() + orjson.dumps(data) + b"\n\n")

        start = {**message, "content": [], "stop_reason": None}
        await event("message_start", {"message": start})
        for index, block in enumerate(content):
            opening = (
                {**block, "input": {}} if block["type"] == "tool_use" else {**block, "text": ""}
            )
            await event("content_block_start", {"index": index, "content_block": opening})
            if block["type"] == "text":
                deltas = [{"type": "text_delta", "text": word} for word in words]
            else:
                piece = arguments[index - (len(content) - len(arguments))]
                deltas = [{"type": "input_json_delta", "partial_json": piece}]
            for delta in deltas:
                await event("content_block_delta", {"index": index, "delta": delta})
            await event("content_block_stop", {"index": index})
        usage = {"output_tokens": message["usage"]["output_tokens"]}
        await event("message_delta", {"delta": {"stop_reason": stop}, "usage": usage})
        await event("message_stop", {})
        await response.write_eof()
        return response

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else str((prompt or [""])[0])
        message = student_message({"messages": [{"role": "user", "content": text}]})
        reply = str(message.get("content") or "")
        answer = text_completion(f"cmpl-student-{len(self.requests)}", body, "", text, reply)
        words = _WORDS.findall(reply)
        if body.get("logprobs") is not None and not body.get("stream"):
            logprob = -5.0 if "unsure" in text else -0.1
            choice = answer["choices"][0]
            choice["logprobs"] = {"tokens": words, "token_logprobs": [logprob] * len(words)}
        if not body.get("stream"):
            return web.json_response(answer)
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return await self._events(request, completion_chunks(answer, words, with_usage))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        text = item_text(last_input(body))
        message = student_message({"messages": [{"role": "user", "content": text}]} | body)
        serial = len(self.requests)
        output: list[dict[str, Any]] = [
            {
                "id": f"fc_student{serial}_{n}",
                "type": "function_call",
                "status": "completed",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            }
            for n, call in enumerate(message.get("tool_calls") or ())
        ]
        if not output:
            part: dict[str, Any] = {"type": "output_text", "text": message.get("content") or ""}
            if message.get("refusal"):
                part = {"type": "refusal", "refusal": message["refusal"]}
            item = {"type": "message", "status": "completed", "role": "assistant"}
            output = [{"id": f"msg_student{serial}", **item, "content": [part]}]
        produced = len(_WORDS.findall(str(message.get("content") or ""))) or 1
        answer = {
            "id": f"resp_student{serial}",
            "object": "response",
            "created_at": CREATED,
            "status": "completed",
            "model": body.get("model"),
            "output": output,
            "usage": {"input_tokens": len(text.split()), "output_tokens": produced}
            | {"total_tokens": len(text.split()) + produced},
        }
        if not body.get("stream"):
            return web.json_response(answer)
        return await self._events(request, responses_events(answer))

    async def _events(self, request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        await response.write_eof()
        return response

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

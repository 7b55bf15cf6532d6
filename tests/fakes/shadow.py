"""Fakes for shadow traffic: an oracle whose answers are the same bytes however many
other calls it served, and a pairwise judge.

``StableOracleThread`` answers as ``OracleUpstreamThread`` (its facts are the system
prompt) with an id derived from the request's messages, so a live answer's bytes do not
depend on the calls served around it; it streams when asked; ``seen`` keeps each
request's ``stream``, ``max_tokens`` and system prompt. A call whose system prompt holds
``HOLD`` waits until ``release()`` (``held`` counts them).

``PairwiseJudgeThread`` answers a pairwise prompt (``<answer_1>``, ``<answer_2>``) with
``VERDICT: 1`` always (``mode="first"``), or by content (``mode="content"``): the answer
holding ``good`` and not the other wins, else a tie. ``prompts`` keeps each user message.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from typing import Any, Literal

import orjson
from aiohttp import web

from tests.fakes.loopback import LoopbackThread
from tests.fakes.oracle import OracleUpstreamThread, oracle_reply

HOLD = "HOLD-THIS-CALL"
_ANSWER = re.compile(r"<answer_(\d)>\n(.*?)\n</answer_\d>", re.S)


class StableOracleThread(OracleUpstreamThread):
    """The oracle with content-derived ids and streaming (module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, Any]] = []
        self.held = 0
        self._released = asyncio.Event()

    def release(self) -> None:
        """Answer the held calls (and every later one)."""
        self._loop.call_soon_threadsafe(self._released.set)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        messages = body.get("messages") or []
        self.calls += 1
        system = "\n".join(str(m.get("content")) for m in messages if m.get("role") == "system")
        self.seen.append(
            {
                "stream": bool(body.get("stream")),
                "max_tokens": body.get("max_tokens"),
                "system": system,
            }
        )
        if HOLD in system:
            self.held += 1
            await self._released.wait()
        reply = oracle_reply(messages, False)
        ident = "chatcmpl-" + hashlib.sha256(orjson.dumps(messages)).hexdigest()[:12]
        base = {"id": ident, "created": 0, "model": body.get("model", "oracle")}
        if not body.get("stream"):
            data = {
                **base,
                "object": "chat.completion",
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
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        chunk = {**base, "object": "chat.completion.chunk"}
        for delta, finish in (({"role": "assistant", "content": reply}, None), ({}, "stop")):
            event = {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        await response.write(
            b"data: " + orjson.dumps({**chunk, "choices": [], "usage": usage}) + b"\n\n"
        )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class PairwiseJudgeThread(LoopbackThread):
    """The fake pairwise judge (module doc)."""

    def __init__(self, mode: Literal["first", "content"], good: str = "") -> None:
        super().__init__()
        self.mode, self.good = mode, good
        self.prompts: list[str] = []
        self.systems: list[str] = []

    def verdict(self, prompt: str) -> str:
        """The judge's verdict on one prompt: ``1``, ``2`` or ``tie``."""
        if self.mode == "first":
            return "1"
        answers = dict(_ANSWER.findall(prompt))
        first, second = (self.good in answers.get(n, "") for n in ("1", "2"))
        return "1" if first and not second else "2" if second and not first else "tie"

    async def _chat(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = orjson.loads(await request.read())
        messages = body.get("messages") or []
        prompt = "\n".join(str(m.get("content")) for m in messages if m.get("role") == "user")
        self.prompts.append(prompt)
        self.systems += [str(m.get("content")) for m in messages if m.get("role") == "system"]
        data = {
            "id": f"chatcmpl-judge{len(self.prompts)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "judge"),
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": f"Compared both.\nVERDICT: {self.verdict(prompt)}",
                    },
                    "finish_reason": "stop",
                }
            ],
        }
        return web.json_response(data)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

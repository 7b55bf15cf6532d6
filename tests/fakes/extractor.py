"""A fake extractor model: a real OpenAI-compatible HTTP server on loopback that reads an
extractor prompt (``reef.learning.extractor``) by one rule and answers the JSON it asks
for, so tests can follow the extractor's plumbing end to end.

``POST /v1/chat/completions``: the reply is ``{"correction": "<v>"}`` where ``v`` is the
first match of ``pattern`` in the ``<reply>`` block, else ``{"correction": null}``; with
``answer`` set it answers that text instead (a model that misreads). With ``failing``
set it answers 503. ``calls`` counts completions; ``models`` keeps each request's model.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.loopback import LoopbackThread

_REPLY = re.compile(r"<reply>\n(.*?)\n</reply>", re.S)


class ExtractorUpstreamThread(LoopbackThread):
    """The fake extractor on its own event loop in a background thread (``with`` it)."""

    def __init__(self, pattern: str = r"#\d+") -> None:
        super().__init__()
        self.pattern = re.compile(pattern)
        self.answer: str | None = None
        self.failing = False
        self.calls = 0
        self.models: list[str] = []

    def read(self, prompt: str) -> str:
        """The fake's JSON reply to an extractor prompt (module doc)."""
        if self.answer is not None:
            return self.answer
        said = _REPLY.search(prompt)
        found = self.pattern.search(said.group(1)) if said else None
        return orjson.dumps({"correction": found.group(0) if found else None}).decode()

    async def _chat(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = orjson.loads(await request.read())
        if self.failing:
            return web.json_response({"error": {"message": "extractor down"}}, status=503)
        self.calls += 1
        self.models.append(str(body.get("model")))
        users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
        prompt = str(users[-1].get("content") or "") if users else ""
        data = {
            "id": f"chatcmpl-extractor{self.calls}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "extractor"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.read(prompt)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

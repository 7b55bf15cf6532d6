"""A fake judge model: a real OpenAI-compatible HTTP server on loopback that grades the
answers in a judge prompt by one rule, so tests can tell a right grade from a wrong one.

``POST /v1/chat/completions``: every ``<answer>`` block (``<answer id=X>`` in a ranking
prompt) scores ``high`` when it contains ``good`` and ``low`` otherwise; the reply is a
rationale, then ``SCORE: n`` (one answer) or ``SCORE X: n`` lines (several). With
``failing`` set it answers 503. ``calls`` counts completions; ``prompts`` keeps each
request's user message.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.loopback import LoopbackThread

_ANSWER = re.compile(r"<answer(?: id=(\w))?>\n(.*?)\n</answer>", re.S)


class JudgeUpstreamThread(LoopbackThread):
    """The fake judge on its own event loop in a background thread (``with`` it)."""

    def __init__(self, good: str, high: int = 9, low: int = 2) -> None:
        super().__init__()
        self.good, self.high, self.low = good, high, low
        self.failing = False
        self.calls = 0
        self.prompts: list[str] = []

    def grade(self, prompt: str) -> str:
        """The judge's reply to a prompt (module doc)."""
        found = _ANSWER.findall(prompt)
        lines = ["Checked each answer for the right team."]
        for label, text in found:
            score = self.high if self.good in text else self.low
            lines.append(f"SCORE {label}: {score}" if label else f"SCORE: {score}")
        return "\n".join(lines)

    async def _chat(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = orjson.loads(await request.read())
        if self.failing:
            return web.json_response({"error": {"message": "judge down"}}, status=503)
        self.calls += 1
        users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
        prompt = str(users[-1].get("content") or "") if users else ""
        self.prompts.append(prompt)
        data = {
            "id": f"chatcmpl-judge{self.calls}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "judge"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.grade(prompt)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

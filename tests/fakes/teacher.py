"""A fake teacher for distillation tests: a real OpenAI-compatible server on loopback
that answers a label task correctly.

``POST /v1/chat/completions`` answers with the label of the first key of ``labels``
found in the last user text (``unknown`` when none is), non-streaming only. Usage counts
words (prompt: every message's words). ``calls`` counts the completions served.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from tests.fakes.loopback import LoopbackThread


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


class TeacherThread(LoopbackThread):
    """The teacher on its own loop in a background thread (``with`` it)."""

    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__()
        self.labels = labels
        self.calls = 0

    def answer(self, text: str) -> str:
        """The right label of ``text`` (module docstring)."""
        lowered = text.lower()
        return next((label for key, label in self.labels.items() if key in lowered), "unknown")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    async def _chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.calls += 1
        messages = body.get("messages") or []
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        content = self.answer(_text(users[-1].get("content")) if users else "")
        prompt = sum(len(_text(m.get("content")).split()) for m in messages if isinstance(m, dict))
        data = {
            "id": f"chatcmpl-teacher-{self.calls}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": 1,
                "total_tokens": prompt + 1,
            },
        }
        return web.json_response(data)

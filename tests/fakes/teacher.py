"""A fake teacher for distillation tests: a real OpenAI-compatible server on loopback
that answers a label task correctly.

``POST /v1/chat/completions`` answers with the label of the first key of ``labels``
found in the last user text (``unknown`` when none is), non-streaming only. Usage counts
words (prompt: every message's words). ``calls`` counts the completions served. A
request with ``logprobs: true`` gets each choice's token logprobs, with
``top_logprobs`` alternatives per token when it asks for them (``token_logprobs``).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.loopback import LoopbackThread


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def token_logprobs(text: str, top: int) -> dict[str, Any]:
    """``text``'s logprobs as an OpenAI-compatible server sends them (a choice's
    ``logprobs``), deterministically: one token per word with the space before it; the
    chosen token at logprob -0.25 and ``top`` alternatives, the token itself first, then
    ``<token>1``, ``<token>2``, ... at -1.5, -2.5, ... (OpenAI's ``bytes`` included)."""
    content = []
    for token in re.findall(r"\s*\S+|\s+$", text):
        alternatives = [(token, -0.25)] + [(f"{token}{i}", -0.5 - i) for i in range(1, top)]
        content.append(
            {
                "token": token,
                "logprob": -0.25,
                "bytes": list(token.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode())}
                    for t, lp in alternatives[:top]
                ],
            }
        )
    return {"content": content, "refusal": None}


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
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop",
        }
        if body.get("logprobs"):
            choice["logprobs"] = token_logprobs(content, int(body.get("top_logprobs") or 0))
        data = {
            "id": f"chatcmpl-teacher-{self.calls}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": 1,
                "total_tokens": prompt + 1,
            },
        }
        return web.json_response(data)

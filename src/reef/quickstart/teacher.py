"""The teacher of ``reef quickstart --task distill``: an OpenAI-compatible server on
loopback, in the quickstart's own process, standing in for the frontier model an
application calls today. Nothing is downloaded: it knows the right label of every ticket
the run draws (``answers``: ticket text -> label) and answers ``POST
/v1/chat/completions`` with it (``unknown`` for any other text).

It is expensive the way a frontier model behind a long prompt is: it reads its few-shot
harness (``harness``, a system prompt of labelled tickets) before the request, and its
``usage.prompt_tokens`` counts both, in the student's tokens (the engine's ``POST
/tokenize``, once the quickstart has given it ``engine_url``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from reef.quickstart.scenario import SYSTEM_PROMPT, Ticket

START_TIMEOUT_SECONDS = 10.0


def teacher_harness(shots: Sequence[Ticket]) -> str:
    """The expensive harness: the task, then every shot as a labelled example (also
    ``bench/distill.py``'s teacher prompt)."""
    lines = [SYSTEM_PROMPT, "", "Examples:"]
    lines += [f"Message: {shot.text}\nLabel: {shot.label}" for shot in shots]
    return "\n".join(lines)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


class Teacher:
    """The teacher server on its own event loop in a background thread (``with`` it;
    ``base_url`` ends in ``/v1``). ``calls`` counts the completions it served."""

    model = "teacher"

    def __init__(self, answers: dict[str, str], harness: str) -> None:
        self.answers = answers
        self.harness = harness
        self.engine_url: str | None = None
        self.calls = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def answer(self, text: str) -> str:
        """The right label of the ticket ``text``."""
        return self.answers.get(text.strip(), "unknown")

    async def _prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        """The harness and ``messages`` in the student's tokens (0 before ``engine_url``)."""
        if self.engine_url is None:
            return 0
        read = [{"role": "system", "content": self.harness}]
        read += [m for m in messages if m.get("role") != "system"]
        url = self.engine_url.removesuffix("/v1") + "/tokenize"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json={"messages": read}) as reply,
        ):
            body = await reply.json()
        return int(body.get("count") or 0)

    async def _chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        users = [m for m in messages if m.get("role") == "user"]
        content = self.answer(_text(users[-1].get("content")) if users else "")
        self.calls += 1
        prompt = await self._prompt_tokens(messages)
        data = {
            "id": f"chatcmpl-teacher-{self.calls}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1},
        }
        return web.json_response(data)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> Teacher:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        future.result(timeout=START_TIMEOUT_SECONDS)
        return self

    def __exit__(self, *exc: object) -> None:
        future = asyncio.run_coroutine_threadsafe(self._stop(), self._loop)
        future.result(timeout=START_TIMEOUT_SECONDS)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=START_TIMEOUT_SECONDS)
        self._loop.close()

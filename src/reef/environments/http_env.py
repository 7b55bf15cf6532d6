"""The ``http`` environment: tools are calls to the user's own service, on loopback
unless ``allow_remote: true`` (it is meant for tests and staging).

The service speaks four JSON routes under ``base_url``:

- ``GET /tools`` → ``{"tools": [OpenAI tool specs]}``;
- ``POST /reset`` with ``{"task": {...}}`` → any 2xx (a 404 means "nothing to reset");
- ``POST /call`` with ``{"task_id", "name", "arguments"}`` → ``{"content": "..."}``
  (any other JSON is shown to the model as JSON); a 4xx or 5xx is the tool's error,
  its body the message;
- ``POST /score`` with ``{"task", "messages"}`` → ``{"score": 0..1, "reason": "..."}``
  (a 404 means "score by the task's ``expected``").
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from pydantic import Field, model_validator

from reef.environments.base import (
    Environment,
    EnvironmentConfig,
    EpisodeError,
    Observation,
    Score,
    ToolError,
    ToolOutput,
    default_score,
)
from reef.environments.tasks import Task

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class HttpEnvironmentConfig(EnvironmentConfig):
    """``base_url``: the service (http or https); ``allow_remote``: allow a host that is
    not loopback (off: only 127.0.0.0/8, ::1 and localhost)."""

    base_url: str = Field(min_length=1)
    allow_remote: bool = False

    @model_validator(mode="after")
    def _loopback_only(self) -> HttpEnvironmentConfig:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL with a host, got {self.base_url!r}")
        if not self.allow_remote and not is_loopback(parts.hostname):
            raise ValueError(
                f"base_url host {parts.hostname!r} is not loopback; "
                "set allow_remote: true to call a service elsewhere"
            )
        return self


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine (a loopback address or ``localhost``)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpEnvironment(Environment):
    """Tools served by an HTTP service (the module docstring)."""

    type_name = "http"
    config_model = HttpEnvironmentConfig

    def __init__(self, config: EnvironmentConfig) -> None:
        super().__init__(config)
        assert isinstance(config, HttpEnvironmentConfig)
        self.base_url = config.base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._task: Task | None = None

    async def start_episode(self, task: Task) -> Observation:
        await self._close_session()
        self._open_session()
        try:
            tools = await self._begin(task)
        except BaseException:
            await self._close_session()
            raise
        self._task = task
        return Observation(task.messages, tuple(tools))

    def _open_session(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.limits.step_timeout_seconds)
        self._session = aiohttp.ClientSession(timeout=timeout)

    async def _begin(self, task: Task) -> list[dict[str, Any]]:
        """The service's tools, after it has been told of the new task."""
        status, body = await self._send("GET", "/tools", None)
        tools = body.get("tools") if status == 200 and isinstance(body, dict) else None
        if not isinstance(tools, list):
            raise EpisodeError(f"{self.base_url}/tools answered {status} without a 'tools' list")
        status, body = await self._send("POST", "/reset", {"task": task.as_dict()})
        if status >= 300 and status != 404:
            raise EpisodeError(f"{self.base_url}/reset answered {status}: {_text(body)}")
        return tools

    async def run_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        if self._task is None:
            raise EpisodeError("run_tool before reset")
        payload = {"task_id": self._task.id, "name": name, "arguments": arguments}
        try:
            status, body = await self._send("POST", "/call", payload)
        except EpisodeError as error:
            raise ToolError(str(error)) from error
        if status >= 400:
            raise ToolError(f"the service answered {status}: {_text(body)}")
        if isinstance(body, dict) and isinstance(body.get("content"), str):
            return body["content"]
        return body

    async def score(self, task: Task, messages: Sequence[dict[str, Any]]) -> Score:
        if self._session is None:  # scored after close(): ask without resetting
            self._open_session()
        status, body = await self._send(
            "POST", "/score", {"task": task.as_dict(), "messages": list(messages)}
        )
        if status == 404:
            return default_score(task, messages)
        if status != 200 or not isinstance(body, dict) or "score" not in body:
            raise EpisodeError(f"{self.base_url}/score answered {status}: {_text(body)}")
        value = min(max(float(body["score"]), 0.0), 1.0)
        return Score(value, str(body.get("reason", "")))

    async def _send(self, method: str, path: str, payload: Any) -> tuple[int, Any]:
        """The status and body (JSON when it parses, else text, cut to the output cap)."""
        assert self._session is not None
        limit = self.limits.max_tool_output_chars
        try:
            async with self._session.request(
                method, self.base_url + path, json=payload
            ) as response:
                raw = await _read_capped(response.content, 4 * limit + 65536)
                status = response.status
        except aiohttp.ClientError as error:
            raise EpisodeError(
                f"could not reach {self.base_url}{path}: {type(error).__name__}: {error}"
            ) from error
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, ToolOutput(text[:limit], len(text))

    async def _close_session(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def close(self) -> None:
        await self._close_session()
        self._task = None
        await super().close()


async def _read_capped(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """At most ``limit`` bytes of ``stream`` (a service answering too much is cut)."""
    data = bytearray()
    while len(data) < limit:
        chunk = await stream.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _text(body: Any) -> str:
    if isinstance(body, ToolOutput):
        return body.text[:500]
    return json.dumps(body, default=str)[:500]

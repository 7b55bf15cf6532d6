"""Run a real gateway (uvicorn on a loopback port) in a background thread for tests."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any, Literal

import anthropic
import openai
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reef.config import ReefSettings
from reef.db import open_database
from reef.experience import SQLExperienceStore
from reef.gateway import create_app
from reef.upstream import Upstream, build_upstream
from tests.polling import eventually


def child_pids(pid: int) -> list[int]:
    """The child processes of ``pid`` (the gateway processes of ``--workers``), from each
    of its threads' ``children`` file (a thread that ends between the listing and the
    read has none to give)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GatewayThread:
    """A gateway serving on ``self.url`` until the context exits.

    ``asgi_spec="2.4"`` serves it as an ASGI 2.4 server does: a ``send`` to a connection
    the client has closed raises ``OSError`` (uvicorn, at 2.3, drops it silently, and
    Starlette then stops a stream by watching for the disconnect instead).
    """

    def __init__(self, settings: ReefSettings, asgi_spec: Literal["2.3", "2.4"] = "2.3") -> None:
        self.settings = settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database = open_database(settings.store_url())
        self.store = SQLExperienceStore(self.database)
        upstreams: dict[str, Upstream] = {
            name: build_upstream(name, cfg) for name, cfg in settings.upstreams.items()
        }
        self.app = create_app(settings, self.database, self.store, upstreams)
        config = uvicorn.Config(
            self.app if asgi_spec == "2.3" else self._as_asgi_2_4(self.app),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            loop="asyncio",
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, daemon=True)
        self._stopped = False
        self._clients: list[openai.OpenAI | anthropic.Anthropic] = []

    def _as_asgi_2_4(self, app: ASGIApp) -> ASGIApp:
        async def served(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            client = tuple(scope["client"])

            async def checked(message: Message) -> None:
                connections = self.server.server_state.connections
                if not any(getattr(c, "client", None) == client for c in connections):
                    raise OSError("the client closed the connection")
                await send(message)

            asgi = {**scope.get("asgi", {}), "spec_version": "2.4"}
            await app({**scope, "asgi": asgi}, receive, checked)

        return served

    def __enter__(self) -> GatewayThread:
        self._thread.start()

        def started() -> bool:
            if not self._thread.is_alive():
                raise RuntimeError("gateway did not start")
            return bool(self.server.started)

        eventually(started, "the gateway to start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stopped:
            return
        self._stopped = True
        for client in self._clients:
            client.close()
        self.server.should_exit = True
        self._thread.join(timeout=20)
        self.store.close()
        self.database.close()

    def openai(self, api_key: str = "none", **headers: str) -> openai.OpenAI:
        """An OpenAI SDK client for this gateway (no SDK retries), closed with the gateway."""
        client = openai.OpenAI(
            base_url=self.url + "/v1", api_key=api_key, max_retries=0, default_headers=headers
        )
        self._clients.append(client)
        return client

    def anthropic(self, api_key: str = "none", **headers: str) -> anthropic.Anthropic:
        """An Anthropic SDK client for this gateway (no SDK retries), closed with the gateway."""
        client = anthropic.Anthropic(
            base_url=self.url, api_key=api_key, max_retries=0, default_headers=headers
        )
        self._clients.append(client)
        return client

    @property
    def writer_stats(self) -> Any:
        return self.app.state.reef.writer.stats


def make_settings(tmp_path: Path, upstream_url: str, **overrides: Any) -> ReefSettings:
    """Settings for a test gateway in front of the fake upstream at ``upstream_url``."""
    base: dict[str, Any] = {
        "home": tmp_path / "home",
        "store": {"url": f"sqlite:///{tmp_path / 'reef.db'}"},
        "upstreams": {
            "fake": {
                "type": "openai",
                "base_url": upstream_url,
                "api_key": "upstream-secret",
                "model": "fake-model",
                "read_timeout_seconds": 2,
                "total_timeout_seconds": 5,
                "max_retries": 2,
            },
            "claude": {
                "type": "anthropic",
                "base_url": upstream_url,
                "api_key": "anthropic-secret",
                "model": "fake-claude",
                "read_timeout_seconds": 2,
                "total_timeout_seconds": 5,
            },
        },
        "scenarios": {
            "support": {"upstream": "fake"},
            "claude": {"upstream": "claude"},
        },
    }
    base.update(overrides)
    return ReefSettings(**base)

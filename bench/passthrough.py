"""A bare aiohttp proxy: the floor any gateway's overhead is measured against.

    .venv/bin/python bench/passthrough.py --port 18610 --upstream http://127.0.0.1:8001/v1

``POST /v1/chat/completions`` is forwarded to ``<upstream>/chat/completions`` through
one shared ``aiohttp.ClientSession`` (keep-alive) and the upstream's body is returned
as is. Nothing is parsed, checked or recorded; ``GET /healthz`` answers 200. It
listens on loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

_SESSION = web.AppKey("session", aiohttp.ClientSession)
_UPSTREAM = web.AppKey("upstream", str)
_FORWARDED = ("Content-Type", "Authorization")


async def chat_completions(request: web.Request) -> web.Response:
    """Forward the body upstream and answer with the upstream's status and body."""
    body = await request.read()
    headers = {name: value for name in _FORWARDED if (value := request.headers.get(name))}
    session = request.app[_SESSION]
    async with session.post(request.app[_UPSTREAM], data=body, headers=headers) as upstream:
        payload = await upstream.read()
        return web.Response(
            body=payload,
            status=upstream.status,
            content_type=upstream.content_type,
        )


async def healthz(request: web.Request) -> web.Response:
    """Liveness, for the benchmark's start-up wait."""
    return web.Response(text="ok")


def build_app(upstream_base_url: str) -> web.Application:
    """The proxy application for an upstream base URL such as ``http://h:p/v1``."""
    app = web.Application()
    app[_UPSTREAM] = upstream_base_url.rstrip("/") + "/chat/completions"

    async def client_session(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=256, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
            app[_SESSION] = session
            yield

    app.cleanup_ctx.append(client_session)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/healthz", healthz)
    return app


def main() -> None:
    """Serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://h:p/v1")
    args = parser.parse_args()
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    web.run_app(
        build_app(args.upstream),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        shutdown_timeout=1.0,
        loop=loop,
    )


if __name__ == "__main__":
    main()

"""A bare aiohttp proxy: the floor any gateway's overhead is measured against.

    .venv/bin/python bench/passthrough.py --port 18610 --upstream http://127.0.0.1:8001/v1

``POST /v1/chat/completions`` is forwarded to ``<upstream>/chat/completions`` through
one shared ``aiohttp.ClientSession`` (keep-alive) and the upstream's body is returned
as is. Nothing is parsed, checked or recorded; ``GET /healthz`` answers 200. It
listens on loopback only. ``--workers N`` runs N such processes on the port, each
bound with ``SO_REUSEPORT`` (aiohttp's ``reuse_port``): the floor for a gateway given
the same cores (``reef serve --workers N``).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
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
    parser.add_argument("--workers", type=int, default=1, help="processes on the port")
    parser.add_argument("--reuse-port", action="store_true", help="bind with SO_REUSEPORT")
    args = parser.parse_args()
    if args.workers > 1:
        serve_workers(args.port, args.upstream, args.workers)
        return
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
        reuse_port=args.reuse_port or None,
    )


def serve_workers(port: int, upstream: str, workers: int) -> None:
    """``workers`` single proxies on ``port``; SIGTERM or SIGINT is passed to each."""
    argv = [sys.executable, __file__, "--port", str(port), "--upstream", upstream]
    children = [subprocess.Popen([*argv, "--reuse-port"]) for _ in range(workers)]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for child in children:
        child.wait()


if __name__ == "__main__":
    main()

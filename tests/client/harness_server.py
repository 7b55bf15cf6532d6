"""A stand-in for the gateway's two harness routes, serving real bytes on loopback.

It speaks exactly the contract ``reef.client`` relies on:

- ``GET /reef/scenarios/{scenario}/harness`` → ``{"scenario", "release_id", "digest"}``
  with headers ``x-reef-release-id`` and ``ETag: "<digest>"``;
- ``GET /reef/scenarios/{scenario}/harness.tar.gz`` → the packed bundle
  (``application/gzip``) with the same headers;
- 404 for a scenario without a harness, 401 without the configured bearer key.

Tests can publish a bundle whose announced digest is wrong, or whose archive headers
name another release, to exercise the client's refusals.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from types import TracebackType

from aiohttp import web

from reef.harness import Bundle, bundle_digest, pack_bundle


@dataclass
class Published:
    release_id: str
    digest: str
    archive: bytes
    archive_release_id: str


class HarnessServer:
    """The stand-in server, run on its own event loop in a background thread."""

    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.published: dict[str, Published] = {}
        self.paths: list[str] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def publish(
        self,
        scenario: str,
        release_id: str,
        bundle: Bundle,
        *,
        announced_digest: str | None = None,
        archive: bytes | None = None,
        archive_release_id: str | None = None,
    ) -> str:
        """Serve ``bundle`` as the scenario's head; the overrides fake a broken server."""
        digest = bundle_digest(bundle)
        self.published[scenario] = Published(
            release_id=release_id,
            digest=announced_digest or digest,
            archive=archive if archive is not None else pack_bundle(bundle),
            archive_release_id=archive_release_id or release_id,
        )
        return digest

    def _lookup(self, request: web.Request) -> Published:
        self.paths.append(request.path)
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            raise web.HTTPUnauthorized(text='{"error": {"message": "bad key"}}')
        published = self.published.get(request.match_info["scenario"])
        if published is None:
            raise web.HTTPNotFound(text='{"error": {"message": "no harness"}}')
        return published

    async def _manifest(self, request: web.Request) -> web.Response:
        published = self._lookup(request)
        body = {
            "scenario": request.match_info["scenario"],
            "release_id": published.release_id,
            "digest": published.digest,
        }
        headers = {"x-reef-release-id": published.release_id, "ETag": f'"{published.digest}"'}
        return web.json_response(body, headers=headers)

    async def _archive(self, request: web.Request) -> web.Response:
        published = self._lookup(request)
        headers = {
            "x-reef-release-id": published.archive_release_id,
            "ETag": f'"{published.digest}"',
        }
        return web.Response(
            body=published.archive, content_type="application/gzip", headers=headers
        )

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/reef/scenarios/{scenario}/harness", self._manifest)
        app.router.add_get("/reef/scenarios/{scenario}/harness.tar.gz", self._archive)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> HarnessServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

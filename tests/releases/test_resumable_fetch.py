"""Downloads from a remote artifact store resume: a real HTTP server on loopback serves a
store's files (ranged reads, as object stores do) and cuts transfers midway; the
download continues from the byte it reached, within one call and across calls, and
only a whole, verified copy is ever published."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from reef.releases import (
    ArtifactCorruptError,
    ArtifactStore,
    ArtifactTransferError,
    open_artifact_store,
)
from reef.releases.artifacts_fsspec import FETCH_ATTEMPTS
from reef.releases.artifacts_upload import TRANSFER_BACKOFF_SECONDS

CHUNK = 1 << 20  # one ranged read
SIZE = 3 * CHUNK + 123


@dataclass
class CuttingServer:
    """Serves ``root`` over HTTP with ranges; the next ``cuts`` ranged GETs that start
    past byte 0 send only ``cut_after`` bytes of their body, then drop the connection."""

    root: Path
    cuts: int = 0
    cut_after: int = 300_000
    ranges: list[str] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = (self.root / request.match_info["tail"]).resolve()
        if not path.is_relative_to(self.root) or not path.is_file():
            raise web.HTTPNotFound()
        ranged = request.headers.get("Range")
        if request.method == "GET" and ranged and ranged.startswith("bytes="):
            self.ranges.append(ranged)
            if self.cuts > 0 and not ranged.startswith("bytes=0-"):
                self.cuts -= 1
                return await self._cut(request, path, ranged)
        return web.FileResponse(path)

    async def _cut(self, request: web.Request, path: Path, ranged: str) -> web.StreamResponse:
        start, _, end = ranged.removeprefix("bytes=").partition("-")
        data = await asyncio.to_thread(path.read_bytes)
        last = min(int(end), len(data) - 1) if end else len(data) - 1
        body = data[int(start) : last + 1]
        response = web.StreamResponse(status=206)
        response.content_length = len(body)
        response.headers["Content-Range"] = f"bytes {start}-{last}/{len(data)}"
        await response.prepare(request)
        await response.write(body[: self.cut_after])
        assert request.transport is not None
        request.transport.close()  # the rest never comes
        return response


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[CuttingServer, Path]]:
    root = (tmp_path / "store").resolve()
    server = CuttingServer(root)
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server, root
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def _payload() -> bytes:
    return hashlib.sha256(b"seed").digest() * (SIZE // 32) + b"x" * (SIZE % 32)


def _stored(
    root: Path, server: CuttingServer, cache: Path, waits: list[float] | None = None
) -> tuple[str, ArtifactStore]:
    """The payload stored in ``root``; the same store read over ``server`` (HTTP), its
    waits before a retry recorded in ``waits`` instead of slept."""
    digest = open_artifact_store(root).put_bytes(_payload(), "checkpoint")
    sleep = (waits if waits is not None else []).append
    return digest, open_artifact_store(server.url, cache_dir=cache, sleep=sleep)


def test_a_cut_transfer_continues_from_the_byte_it_reached(
    served: tuple[CuttingServer, Path], tmp_path: Path
) -> None:
    server, root = served
    waits: list[float] = []
    digest, remote = _stored(root, server, tmp_path / "cache", waits)
    server.cuts = 2
    copy = remote.materialize(digest)
    assert copy.read_bytes() == _payload()
    assert len(waits) == 2  # a backoff before each try after a cut
    assert 0 <= waits[0] <= TRANSFER_BACKOFF_SECONDS
    assert 0 <= waits[1] <= 2 * TRANSFER_BACKOFF_SECONDS
    offsets = [int(r.removeprefix("bytes=").split("-")[0]) for r in server.ranges]
    # the second chunk was cut twice and fetched again from its start; the first chunk,
    # already on disk, was never asked for again
    assert offsets == [0, CHUNK, CHUNK, CHUNK, 2 * CHUNK, 3 * CHUNK], server.ranges
    assert not list((tmp_path / "cache" / ".partial").iterdir()), "the partial is gone"


def test_a_failed_download_is_kept_and_the_next_call_continues_it(
    served: tuple[CuttingServer, Path], tmp_path: Path
) -> None:
    server, root = served
    waits: list[float] = []
    digest, remote = _stored(root, server, tmp_path / "cache", waits)
    server.cuts = FETCH_ATTEMPTS
    with pytest.raises(ArtifactTransferError, match="next try continues"):
        remote.materialize(digest)
    assert len(waits) == FETCH_ATTEMPTS - 1  # no wait after the last try
    [partial] = (tmp_path / "cache" / ".partial").iterdir()
    kept = partial.stat().st_size
    assert kept == CHUNK, "the chunk that arrived whole is kept"
    assert not list((tmp_path / "cache").glob("sha256-*")), "nothing half-fetched is published"
    server.ranges.clear()
    copy = remote.materialize(digest)
    assert copy.read_bytes() == _payload()
    assert server.ranges[0].startswith(f"bytes={kept}-"), server.ranges


def test_a_directory_artifact_resumes_and_is_verified_before_it_is_published(
    served: tuple[CuttingServer, Path], tmp_path: Path
) -> None:
    server, root = served
    tree = tmp_path / "ckpt"
    tree.mkdir()
    (tree / "model.safetensors").write_bytes(_payload())
    (tree / "config.json").write_text('{"model_type": "llama"}')
    digest = open_artifact_store(root).put_dir(tree, "checkpoint")
    waits: list[float] = []
    remote = open_artifact_store(server.url, cache_dir=tmp_path / "cache", sleep=waits.append)
    server.cuts = 1
    copy = remote.materialize(digest)
    assert (copy / "model.safetensors").read_bytes() == _payload()
    assert (copy / "config.json").read_text() == '{"model_type": "llama"}'
    assert len(waits) == 1


def test_a_partial_that_does_not_verify_is_dropped(
    served: tuple[CuttingServer, Path], tmp_path: Path
) -> None:
    server, root = served
    digest, remote = _stored(root, server, tmp_path / "cache")
    partial = tmp_path / "cache" / ".partial" / f"sha256-{digest.removeprefix('sha256:')}"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"not the start of it")  # a damaged earlier download
    with pytest.raises(ArtifactCorruptError):
        remote.materialize(digest)
    assert not partial.exists(), "the bad partial is deleted"
    assert remote.materialize(digest).read_bytes() == _payload(), "the next call starts afresh"

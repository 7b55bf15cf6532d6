"""Uploads to a remote artifact store resume: the store is S3 (s3fs against moto's S3
server on loopback), reached through a proxy that reads each request's head and, while
told to, drops the connection of every upload of one part. The failed ``put_*`` keeps
the parts it stored; the next one sends only the parts still missing, joins them on the
server, and the artifact reads back whole and verified.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

s3fs = pytest.importorskip("s3fs", reason="the S3 upload test needs s3fs (the dev extra)")
moto_server = pytest.importorskip(
    "moto.server", reason="the S3 upload test needs moto[server] (the dev extra)"
)

import fsspec  # noqa: E402

from reef.core.digests import tree_digest  # noqa: E402
from reef.releases import (  # noqa: E402
    ArtifactTransferError,
    artifacts_upload,
    open_artifact_store,
)

PART = 5 << 20  # S3's smallest part for a server-side join
BUCKET = "reef-artifacts"


@dataclass
class HeadProxy:
    """A loopback TCP proxy to ``target`` that parses request heads (bodies by their
    Content-Length), logs ``(method, path)`` and drops the connection, instead of
    forwarding, of every PUT whose path contains ``refuse`` while it is set."""

    target: tuple[str, int]
    refuse: str | None = None
    seen: list[tuple[str, str]] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def __enter__(self) -> HeadProxy:
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def puts(self, marker: str) -> list[str]:
        """Paths of the PUTs seen whose path contains ``marker``."""
        return [path for method, path in self.seen if method == "PUT" and marker in path]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        back = asyncio.ensure_future(self._pump(upstream_reader, writer))
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
                self.seen.append((method, path))
                if method == "PUT" and self.refuse is not None and self.refuse in path:
                    break  # dropped: the client sees its connection cut
                upstream_writer.write(head)
                length = 0
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                while length:
                    chunk = await reader.read(min(length, 1 << 16))
                    if not chunk:
                        return
                    upstream_writer.write(chunk)
                    length -= len(chunk)
                await upstream_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            back.cancel()
            for stream in (writer, upstream_writer):
                with contextlib.suppress(Exception):
                    stream.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while chunk := await reader.read(1 << 16):
                writer.write(chunk)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.close()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeadProxy]:
    """moto's S3 server on loopback behind the proxy; s3fs configured to reach it, with
    its own and botocore's retries off so that a dropped upload reaches the store."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        with HeadProxy(server.get_host_and_port()) as proxy:
            options = {
                "endpoint_url": f"http://127.0.0.1:{proxy.port}",
                "key": "testing",
                "secret": "testing",
                "client_kwargs": {"region_name": "eu-west-1"},
                "config_kwargs": {"retries": {"max_attempts": 1}},
            }
            monkeypatch.setitem(fsspec.config.conf, "s3", options)
            monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
            monkeypatch.setattr(artifacts_upload, "PART_BYTES", PART)
            monkeypatch.setattr(artifacts_upload, "UPLOAD_ATTEMPTS", 2)
            fsspec.filesystem("s3").makedirs(BUCKET, exist_ok=True)  # moto keeps buckets
            try:
                yield proxy
            finally:  # the client's connections go before the proxy's loop does
                s3fs.S3FileSystem.clear_instance_cache()
                gc.collect()
    finally:
        server.stop()


def _data(size: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def test_a_cut_upload_resumes_from_the_parts_it_stored(s3: HeadProxy, tmp_path: Path) -> None:
    source = tmp_path / "weights.safetensors"
    source.write_bytes(_data(3 * PART + 1234, seed=1))  # four parts
    store = open_artifact_store(f"s3://{BUCKET}/{tmp_path.name}", cache_dir=tmp_path / "cache")

    s3.refuse = "part-00002"
    with pytest.raises(ArtifactTransferError, match="part-00002 after 2 tries"):
        store.put_file(source, "checkpoint")
    assert [p.rsplit("/", 1)[-1] for p in s3.puts("/part-0000")][:4] == [
        "part-00000",
        "part-00000.sha256",
        "part-00001",
        "part-00001.sha256",
    ]
    s3.refuse = None
    s3.seen.clear()
    digest = store.put_file(source, "checkpoint")
    # only the parts still missing were sent again
    sent = sorted({p.rsplit("/", 1)[-1] for p in s3.puts("/part-0000") if "?" not in p})
    assert sent == ["part-00002", "part-00002.sha256", "part-00003", "part-00003.sha256"]
    copy = store.materialize(digest)
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest.removeprefix("sha256:")
    assert copy.read_bytes() == source.read_bytes()
    s3fs_ = fsspec.filesystem("s3")
    assert not s3fs_.exists(f"{BUCKET}/{tmp_path.name}/tmp/up-{digest.removeprefix('sha256:')}")


def test_a_directory_goes_up_in_parts_and_comes_back_whole(s3: HeadProxy, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"model_type": "llama"}')
    (checkpoint / "model-00001-of-00002.safetensors").write_bytes(_data(PART + 77, seed=2))
    (checkpoint / "model-00002-of-00002.safetensors").write_bytes(_data(PART // 2, seed=3))
    store = open_artifact_store(f"s3://{BUCKET}/{tmp_path.name}", cache_dir=tmp_path / "cache")
    digest = store.put_dir(checkpoint, "checkpoint")
    assert digest == tree_digest(checkpoint)
    assert len({p for p in s3.puts("/part-0000") if "?" not in p}) == 4  # two parts, two marks
    copy = store.materialize(digest)
    assert tree_digest(copy) == digest
    assert store.info(digest).kind == "checkpoint"

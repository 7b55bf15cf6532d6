"""SIGKILL the gateway under load in sync durability: every receipt given is in the store
(one process, or every process of ``--workers 2`` at once)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import child_pids, free_port
from tests.gateway.rawhttp import call
from tests.polling import eventually

TOTAL_REQUESTS = 400
KILL_AFTER_RECEIPTS = 150
CONCURRENCY = 16


def _start_gateway(
    tmp_path: Path, upstream_url: str, workers: int = 1
) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    db = tmp_path / "crash.db"
    config = {
        "home": str(tmp_path / "home"),
        "server": {"port": port, "workers": workers},
        "store": {"url": f"sqlite:///{db}", "durability": "sync"},
        "upstreams": {"fake": {"type": "openai", "base_url": upstream_url, "model": "m"}},
    }
    path = tmp_path / "reef.yaml"
    path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "reef", "serve", "-c", str(path), "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,  # read only to explain a failed start
    )
    return process, port, db


def _wait_healthy(port: int, process: subprocess.Popen[bytes]) -> None:
    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited: {process.stderr.read().decode()}")  # type: ignore[union-attr]
        return call(port, "GET", "/healthz").status == 200

    eventually(healthy, "the gateway to become healthy", timeout_seconds=30, ignoring=(OSError,))


def _kill_all(pid: int) -> None:
    """SIGKILL ``pid`` and its children (the gateway processes of ``--workers``) at once."""
    for target in (*child_pids(pid), pid):
        os.kill(target, signal.SIGKILL)


def _kill_one_worker(pid: int) -> None:
    """SIGKILL one gateway process of ``--workers``: the parent and the other go on."""
    os.kill(child_pids(pid)[0], signal.SIGKILL)


async def _load_then_kill(
    port: int, process: subprocess.Popen[bytes], kill: Callable[[int], None] = _kill_all
) -> list[str]:
    receipts: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(TOTAL_REQUESTS):
        queue.put_nowait(i)
    killed = asyncio.Event()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            body = {"model": "reef/crash", "messages": [{"role": "user", "content": f"req {i}"}]}
            try:
                async with session.post(url, json=body) as response:
                    await response.read()
                    if response.status == 200:
                        receipts.append(response.headers["x-reef-record-id"])
            except (TimeoutError, aiohttp.ClientError):
                continue
            if len(receipts) >= KILL_AFTER_RECEIPTS and not killed.is_set():
                killed.set()
                kill(process.pid)

    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(CONCURRENCY)))
    return receipts


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_sigkill_loses_no_receipt(tmp_path: Path, workers: int) -> None:
    with FakeUpstreamThread() as fake:
        process, port, db = _start_gateway(tmp_path, fake.base_url, workers)
        try:
            _wait_healthy(port, process)
            receipts = asyncio.run(_load_then_kill(port, process))
        finally:
            process.kill()
            process.wait(timeout=10)
            stderr = _stderr_of(process)
    assert process.returncode == -signal.SIGKILL, stderr
    assert len(receipts) >= KILL_AFTER_RECEIPTS
    _assert_stored(db, receipts)


def test_sigkill_of_one_worker_under_load_loses_no_receipt(tmp_path: Path) -> None:
    """One of two gateway processes killed mid-load, its record batches in flight: every
    receipt either process gave is in the store (a response is sent only after its
    record's COMMIT), and the load goes on on the other."""
    with FakeUpstreamThread() as fake:
        process, port, db = _start_gateway(tmp_path, fake.base_url, workers=2)
        try:
            _wait_healthy(port, process)
            receipts = asyncio.run(_load_then_kill(port, process, _kill_one_worker))
            assert process.poll() is None  # the parent serves on
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
            stderr = _stderr_of(process)
    assert process.returncode == -signal.SIGTERM, stderr
    assert len(receipts) > KILL_AFTER_RECEIPTS  # the other process went on serving
    _assert_stored(db, receipts)


def _stderr_of(process: subprocess.Popen[bytes]) -> str:
    """What an ended gateway wrote to its stderr (then closed)."""
    assert process.stderr is not None
    try:
        return process.stderr.read().decode(errors="replace")
    finally:
        process.stderr.close()


def _assert_stored(db: Path, receipts: list[str]) -> None:
    """The database is intact and holds every receipt a client was given."""
    connection = sqlite3.connect(db)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        stored = {row[0] for row in connection.execute("SELECT id FROM records")}
    finally:
        connection.close()
    missing = [r for r in receipts if r not in stored]
    assert not missing, f"{len(missing)} of {len(receipts)} receipts lost"


def test_a_stream_cut_by_sigkill_is_stored_and_settled_at_the_next_start(
    tmp_path: Path,
) -> None:
    with FakeUpstreamThread(slow_chunks=400, slow_interval=0.05) as fake:
        process, port, db = _start_gateway(tmp_path, fake.base_url)
        try:
            _wait_healthy(port, process)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            body = {
                "model": "reef/crash",
                "stream": True,
                "messages": [{"role": "user", "content": "slow-stream"}],
            }
            conn.request(
                "POST",
                "/v1/chat/completions",
                json.dumps(body),
                {"content-type": "application/json"},
            )
            response = conn.getresponse()
            receipt = response.headers["x-reef-record-id"]
            assert response.readline().startswith(b"data:")
            os.kill(process.pid, signal.SIGKILL)  # mid-stream
            process.wait(timeout=10)
            conn.close()
        finally:
            process.kill()
            process.wait(timeout=10)
            assert process.stderr is not None
            process.stderr.close()
        assert process.returncode == -signal.SIGKILL
        connection = sqlite3.connect(db)
        try:
            row = connection.execute("SELECT status FROM records WHERE id = ?", (receipt,))
            assert row.fetchone() == ("pending",)
        finally:
            connection.close()

        again, port, _ = _start_gateway(tmp_path, fake.base_url)
        try:
            _wait_healthy(port, again)
            record = call(port, "GET", f"/reef/records/{receipt}")
        finally:
            again.terminate()
            again.wait(timeout=30)
            assert again.stderr is not None
            again.stderr.close()
    assert record.status == 200
    stored = json.loads(record.body)
    assert stored["status"] == "aborted"
    assert stored["error"].startswith("interrupted: the gateway stopped before this stream ended")

"""``reef serve`` on a local upstream: the engine child starts, serves, and dies with us."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai

from tests.gateway.harness import free_port


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_until(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_serve_starts_the_engine_and_leaves_no_orphan(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "reef.yaml").write_text(
        f"server: {{port: {port}}}\nupstreams:\n  local: {{type: local, model: tiny-random}}\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "reef", "serve", "--log-level", "WARNING"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    try:

        def ready() -> bool:
            assert process.poll() is None, "reef serve exited"
            try:
                client.models.list()
                return True
            except openai.APIConnectionError:
                return False

        _wait_until(ready, 120, "reef serve to listen")
        raw = client.chat.completions.with_raw_response.create(
            model="reef/default", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert raw.parse().model == "tiny-random"
        assert raw.headers["x-reef-record-id"]
        engines = _children(process.pid)
        assert len(engines) == 1
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        _wait_until(lambda: not _alive(engines[0]), 30, "the engine to exit with its parent")
    finally:
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (tmp_path / ".reef" / "reef.db").exists()

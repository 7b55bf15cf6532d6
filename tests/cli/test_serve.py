"""``reef serve`` on a local upstream: the engine child starts, serves, and dies with us;
it is in a process group of its own, out of reach of the terminal's Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai

from tests.gateway.harness import free_port
from tests.polling import eventually


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


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
            client.models.list()
            return True

        eventually(
            ready,
            "reef serve to listen",
            timeout_seconds=120,
            interval_seconds=0.05,
            ignoring=(openai.APIConnectionError,),
        )
        raw = client.chat.completions.with_raw_response.create(
            model="reef/default", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert raw.parse().model == "tiny-random"
        assert raw.headers["x-reef-record-id"]
        engines = _children(process.pid)
        assert len(engines) == 1
        # A process group of its own: a terminal's Ctrl-C reaches only reef serve, which
        # lets the engine's streams run through its grace and stops the engine after.
        assert os.getpgid(engines[0]) == engines[0] != os.getpgid(process.pid)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        eventually(
            lambda: not _alive(engines[0]), "the engine to exit with its parent", timeout_seconds=30
        )
    finally:
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (tmp_path / ".reef" / "reef.db").exists()

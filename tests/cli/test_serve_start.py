"""``reef serve`` starting up: a taken port is found before any model loads, and a
ready gateway prints where it is (gateway, dashboard, docs) and that it has no keys."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.harness import free_port

NO_MODEL = "upstreams:\n  u: {type: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n"
LOCAL = "upstreams:\n  local: {type: local, model: tiny-random}\n"


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def serve(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reef", "serve", "--no-worker", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_port_refused(result: subprocess.CompletedProcess[str], port: int) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"127.0.0.1:{port}" in last and "in use" in last, last
    assert "--port" in last and "server.port" in last, last
    assert "starting the embedded engine" not in result.stderr


def test_a_taken_port_from_the_config_is_refused_before_any_model_loads(
    tmp_path: Path, taken_port: int
) -> None:
    (tmp_path / "reef.yaml").write_text(f"server: {{port: {taken_port}}}\n{LOCAL}")
    assert_port_refused(serve(tmp_path), taken_port)
    assert not (tmp_path / ".reef").exists()  # nothing created, no store opened


def test_a_taken_port_from_the_flag_is_refused_before_any_model_loads(
    tmp_path: Path, taken_port: int
) -> None:
    (tmp_path / "reef.yaml").write_text(LOCAL)
    assert_port_refused(serve(tmp_path, "--port", str(taken_port)), taken_port)


def _lines(stream: object, into: queue.Queue[str | None]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line)
    into.put(None)


def test_a_ready_gateway_prints_its_gateway_dashboard_and_docs_urls(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "reef.yaml").write_text(f"server: {{port: {port}}}\n{NO_MODEL}")
    process = subprocess.Popen(
        [sys.executable, "-m", "reef", "serve", "--no-worker", "--log-level", "WARNING"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
    shown: list[str] = []
    try:
        while not any("  keys  " in line for line in shown):
            line = lines.get(timeout=60)
            assert line is not None, "".join(shown) + (
                process.stderr.read() if process.stderr else ""
            )
            shown.append(line)
        base = f"http://127.0.0.1:{port}"
        text = "".join(shown)
        assert f"{base}/v1" in text and f"{base}/ui" in text and f"{base}/docs" in text, text
        # No keys configured: the banner says so and what it means; it binds loopback.
        assert "keys       none: every caller" in text and "auth.keys" in text, text
        # Printed only once the gateway answers.
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as response:
            assert response.status == 200
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()

"""The README's snippet, executed as a newcomer runs it: after a quickstart run (on the
tiny model, one short round), ``reef serve`` in the quickstart's folder as the README
says, then the python block of README.md as it is written (only the port changes when
the folder's port, 8600, is taken on this machine)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from reef.cli.main import app
from reef.quickstart.session import DEFAULT_PORT, choose_port
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.gateway.harness import free_port
from tests.polling import eventually

README = Path(__file__).resolve().parents[2] / "README.md"
DOCS_URL = f"http://127.0.0.1:{DEFAULT_PORT}"


def readme_snippet() -> str:
    """The README's python block (there is exactly one)."""
    [block] = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    return str(block)


def test_the_snippet_names_the_quickstart_scenario_and_asks_for_a_reproducible_answer() -> None:
    snippet = readme_snippet()
    assert 'model="reef/triage"' in snippet
    assert "temperature=0" in snippet and "max_tokens=" in snippet and "max_retries=0" in snippet
    assert f"{DOCS_URL}/v1" in snippet
    assert "cd reef-quickstart && reef serve" in README.read_text(encoding="utf-8")
    assert len(README.read_text(encoding="utf-8").splitlines()) < 80


def _is_free(port: int) -> bool:
    return choose_port(None, default=port) == (port, "")


@pytest.mark.slow
@pytest.mark.filterwarnings(PEFT_WRAP_WARNING)
def test_the_readme_snippet_works_right_after_the_quickstart(tmp_path: Path) -> None:
    root = tmp_path / "reef-quickstart"
    args = ["quickstart", "--model", "tiny-random", "--rounds", "1", "--dir", str(root)]
    args += ["--requests", "12", "--heldout", "6", "--dtype", "bfloat16"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)

    port = yaml.safe_load((root / "reef.yaml").read_text())["server"]["port"]
    served = f"http://127.0.0.1:{port}/v1"
    assert f"reef serve (gateway on {served}" in " ".join(result.output.split())
    if port != DEFAULT_PORT:
        assert f"port {DEFAULT_PORT} is taken" in result.output

    env = dict(os.environ)
    if not _is_free(port):  # another test or program took it since: serve elsewhere
        port = free_port()
        env["REEF_SERVER__PORT"] = str(port)
    process = subprocess.Popen(
        [sys.executable, "-m", "reef", "serve", "--no-worker", "--log-level", "WARNING"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert process.poll() is None, f"reef serve exited: {process.stderr.read()}"  # type: ignore[union-attr]
            return httpx.get(f"{base}/readyz", timeout=5).status_code == 200

        eventually(
            ready,
            "reef serve to answer",
            timeout_seconds=120,
            interval_seconds=0.1,
            ignoring=(httpx.TransportError,),
        )
        namespace: dict[str, Any] = {}
        exec(readme_snippet().replace(DOCS_URL, base), namespace)  # the README as written

        raw = namespace["raw"]
        reply = raw.parse()
        assert isinstance(reply.choices[0].message.content, str)
        record = httpx.get(f"{base}/reef/records/{namespace['record_id']}", timeout=10).json()
        assert record["scenario"] == "triage"
        assert record["request"]["temperature"] == 0
        head = httpx.get(f"{base}/reef/scenarios/triage/releases?limit=1", timeout=10).json()
        assert raw.headers["x-reef-release-id"] == head["data"][0]["id"], "the learned head serves"
        assert head["data"][0]["seq"] >= 1
        namespace["client"].close()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()

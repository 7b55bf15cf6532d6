"""The engine as a child process: READY line, clean stop, death with its parent,
and the import boundaries that keep torch out of ``import reef``."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import reef.engine
from reef.engine.process import (
    EngineOptions,
    ReadyInfo,
    engine_command,
    parse_ready_line,
    ready_line,
)
from tests.polling import eventually

ENGINE_SOURCE = Path(reef.engine.__file__).parent


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in {"Z", "X"}


def _read_ready(process: subprocess.Popen[str]) -> ReadyInfo:
    assert process.stdout is not None
    for line in process.stdout:
        info = parse_ready_line(line.strip())
        if info is not None:
            return info
    raise AssertionError(f"no READY line; exit code {process.wait()}")


def test_ready_line_round_trips() -> None:
    info = ReadyInfo("127.0.0.1", 8601, "tiny-random")
    assert parse_ready_line(ready_line(info)) == info
    assert json.loads(ready_line(info).split(" ", 1)[1])["base_url"] == info.base_url
    assert parse_ready_line("some log line") is None


def test_child_prints_ready_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    command = engine_command("tiny-random", tmp_path, options=EngineOptions(threads=1))
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as child:
        try:
            info = _read_ready(child)
            assert info.port > 0 and info.model == "tiny-random"
            with urllib.request.urlopen(info.base_url.removesuffix("/v1") + "/health") as reply:
                assert json.load(reply)["status"] == "ok"
        finally:
            child.send_signal(signal.SIGTERM)
        assert child.wait(20) == 0


def test_child_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    parent_script = textwrap.dedent(
        f"""
        import signal, subprocess
        from reef.engine.process import EngineOptions, engine_command
        options = EngineOptions(threads=1)
        child = subprocess.Popen(engine_command("tiny-random", {str(tmp_path)!r}, options=options))
        print("CHILD", child.pid, flush=True)
        signal.pause()  # until the test kills this parent
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", parent_script], stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline().split()[1])
        _read_ready(parent)  # the child shares the parent's stdout
        assert _alive(child_pid)
        parent.kill()
        parent.wait(10)
        eventually(lambda: not _alive(child_pid), "the orphaned engine to exit")


def test_import_reef_and_the_process_contract_load_no_torch() -> None:
    code = (
        "import sys, reef, reef.engine, reef.engine.process, reef.engine.digest, "
        "reef.cli.engine\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'torch', 'transformers', 'peft'}))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "[]"


def test_engine_imports_neither_gateway_nor_experience() -> None:
    forbidden = ("reef.gateway", "reef.experience", "reef.learning")
    for source in ENGINE_SOURCE.glob("*.py"):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(forbidden), f"{source.name} imports {name}"


def test_python_dash_m_shows_help() -> None:
    output = subprocess.run(
        [sys.executable, "-m", "reef.engine", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    assert "--model" in output and "--port" in output

"""The python environment's OS boundary: with bubblewrap on, a tool that reads Reef's
database, dials a listener on loopback, fork-bombs or writes a huge file fails, and
the episode reports the tool's error; the same tools show, without the boundary, what
the audit hook alone lets through. Without a boundary, ``/reef/status`` and
``reef status`` say so.

The tools run from a project directory laid out as an operator's is (``reef.yaml``,
``.reef/reef.db``, the toolset module beside them) that is also the current directory.
The bubblewrap tests skip where no sandbox starts; CI installs bubblewrap and sets
``REEF_TEST_REQUIRE_BWRAP=1``, so there they fail instead.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.environments import (
    EpisodeError,
    EpisodeLimits,
    PythonEnvironment,
    PythonEnvironmentConfig,
    SandboxConfig,
    Task,
    ToolResult,
    hide_from_tools,
    play_episode,
    tool_isolation,
)
from reef.environments import isolation as isolation_module
from tests.environments import toolsets
from tests.environments.episodes import endpoint
from tests.fakes.scripted import ScriptedChatThread, calls, tool_call
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call

BOUNDARY = tool_isolation()
if BOUNDARY.kind != "bwrap" and os.environ.get("REEF_TEST_REQUIRE_BWRAP") == "1":
    raise RuntimeError(f"REEF_TEST_REQUIRE_BWRAP=1 but no sandbox starts: {BOUNDARY.detail}")
needs_bwrap = pytest.mark.skipif(
    BOUNDARY.kind != "bwrap", reason=f"no bubblewrap sandbox here: {BOUNDARY.detail}"
)
TASK = Task("t1", ({"role": "user", "content": "go"},))
TOOLSET = "project_tools"  # the module the project directory holds
# Forks until the kernel refuses, children parked on a pipe until it exits; stops by
# itself at 300 so a missing limit fails the test instead of the machine.
FORK_BOMB = """
import os
r, w = os.pipe()
n = 0
try:
    while n < 300:
        if os.fork() == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        n += 1
except OSError as error:
    raise SystemExit(f"fork failed after {n} processes: {error}")
print(f"forked {n} processes: no limit held")
"""


def dial(port: int) -> str:
    return (
        "import socket\n"
        f"socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n"
        "print('connected')"
    )


def tool(name: str, call_id: str = "c1", **arguments: Any) -> dict[str, Any]:
    payload = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": payload}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory, the current one: its config, Reef's home with a real
    SQLite database, and the toolset module (importable, as an operator's is). It lies
    in a world-readable ``workspace`` (pytest's own directories are private, and under
    root the worker reads as a uid of its own)."""
    tmp_path = tmp_path / "workspace" / "project"
    tmp_path.mkdir(parents=True)
    (tmp_path / "reef.yaml").write_text("server: {port: 8600}\n")
    (tmp_path / ".reef").mkdir()
    with sqlite3.connect(tmp_path / ".reef" / "reef.db") as database:
        database.execute("create table secrets (value text)")
        database.execute("insert into secrets values ('sk-live-0000')")
    database.close()
    (tmp_path / f"{TOOLSET}.py").write_text(Path(toolsets.__file__).read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


async def run(isolation: str, *calls_: dict[str, Any], **sandbox: Any) -> list[ToolResult]:
    """One episode's step of ``calls_`` in the project's toolset."""
    limits = EpisodeLimits(step_timeout_seconds=30.0, max_tool_output_chars=4000)
    settings = SandboxConfig(isolation=isolation, **sandbox)  # type: ignore[arg-type]
    config = PythonEnvironmentConfig(toolset="project", limits=limits, sandbox=settings)
    async with PythonEnvironment(config, module=TOOLSET) as env:
        await env.reset(TASK)
        return list((await env.step(list(calls_))).results)


@needs_bwrap
async def test_the_reef_database_and_config_are_out_of_sight(project: Path) -> None:
    database, config = await run(
        "bwrap",
        tool("read_file", "a", path=str(project / ".reef" / "reef.db")),
        tool("read_file", "b", path=str(project / "reef.yaml")),
    )
    for result, path in ((database, ".reef/reef.db"), (config, "reef.yaml")):
        assert result.status == "crashed", result.content
        assert f"FileNotFoundError: [Errno 2] No such file or directory: '{project}/{path}'" in (
            result.content
        )


async def test_without_the_boundary_a_tool_reads_the_database(project: Path) -> None:
    """What the audit hook does not stop (and the test above would miss if it broke)."""
    (database,) = await run("none", tool("read_file", path=str(project / ".reef" / "reef.db")))
    assert database.status == "ok"
    assert bytes.fromhex(database.content).startswith(b"SQLite format 3")


@needs_bwrap
async def test_a_directory_bound_for_the_tools_still_hides_the_project(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_paths`` binding the project's parent (the workspace): the current directory
    is covered, the toolset (bound deeper) shows again, a path given to
    ``hide_from_tools`` is covered."""
    shared = project.parent / "shared-data"
    (shared / "private").mkdir(parents=True)
    (shared / "open.txt").write_text("open")
    (shared / "private" / "key.txt").write_text("key")
    monkeypatch.setattr(isolation_module, "_hidden", set())
    hide_from_tools(shared / "private")
    results = await run(
        "bwrap",
        tool("read_file", "a", path=str(project / ".reef" / "reef.db")),
        tool("read_file", "b", path=str(shared / "open.txt")),
        tool("read_file", "c", path=str(shared / "private" / "key.txt")),
        read_paths=(str(project.parent),),
    )
    assert [result.status for result in results] == ["crashed", "ok", "crashed"]
    assert bytes.fromhex(results[1].content) == b"open"
    assert "FileNotFoundError" in results[0].content and "FileNotFoundError" in results[2].content


@needs_bwrap
async def test_a_socket_to_a_listener_on_loopback_fails(project: Path, listener: int) -> None:
    """Dialled from a process started around the audit hook: only the network
    namespace stops it (the sandbox's loopback is its own; nothing listens there)."""
    (result,) = await run("bwrap", tool("run_python", code=dial(listener)))
    assert result.status == "crashed", result.content
    assert "ConnectionRefusedError: [Errno 111] Connection refused" in result.content


async def test_without_the_boundary_the_same_socket_connects(project: Path, listener: int) -> None:
    (result,) = await run("none", tool("run_python", code=dial(listener)))
    assert (result.status, result.content) == ("ok", "connected")


@needs_bwrap
async def test_a_fork_bomb_hits_the_process_limit_and_the_tools_live_on(project: Path) -> None:
    bomb, after = await run(
        "bwrap",
        tool("run_python", "a", code=FORK_BOMB),
        tool("echo", "b", text="still here"),
        processes=16,
    )
    assert bomb.status == "crashed", bomb.content
    assert "Resource temporarily unavailable" in bomb.content
    forked = int(bomb.content.split("fork failed after ")[1].split()[0])
    assert forked < 16
    assert (after.status, after.content) == ("ok", "still here")


@needs_bwrap
async def test_a_huge_file_hits_the_file_size_limit(project: Path) -> None:
    big, count = await run(
        "bwrap",
        tool("write_file", "a", path="/tmp/huge", mib=8),
        tool("run_python", "b", code="import os; print(os.path.getsize('/tmp/huge'))"),
        file_size_mb=2,
    )
    assert big.status == "crashed", big.content
    assert "OSError: [Errno 27] File too large" in big.content
    assert count.content == str(2 * 1024 * 1024)  # the private /tmp holds what fitted


@needs_bwrap
async def test_the_episode_reports_the_tool_error(project: Path) -> None:
    database = str(project / ".reef" / "reef.db")
    script = [calls(tool_call("a", "read_file", {"path": database})), {"content": "no luck"}]
    config = PythonEnvironmentConfig(toolset="project", sandbox=SandboxConfig(isolation="bwrap"))
    task = Task("t", ({"role": "user", "content": "read Reef's database"},))
    with ScriptedChatThread(script) as model:
        async with PythonEnvironment(config, module=TOOLSET) as env:
            result = await play_episode(env, task, endpoint(model.base_url))
    assert (result.stop, result.error) == ("finished", None)
    assert result.tool_status["crashed"] == 1
    assert "FileNotFoundError" in result.messages[2]["content"]


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A PATH without bwrap, and the probe forgotten (before and after)."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    tool_isolation.cache_clear()
    yield
    tool_isolation.cache_clear()


@pytest.mark.usefixtures("no_bwrap")
async def test_bwrap_required_but_missing_fails_the_episode_start_clearly(project: Path) -> None:
    refused = r"need sandbox\.isolation: bwrap, but no sandbox"
    with pytest.raises(EpisodeError, match=refused) as info:
        await run("bwrap", tool("echo", text="x"))
    assert "bwrap is not installed" in str(info.value)
    assert "apt install bubblewrap" in str(info.value)


@pytest.mark.usefixtures("no_bwrap")
def test_without_a_boundary_the_status_says_so(tmp_path: Path) -> None:
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        status = call(gateway.port, "GET", "/reef/status").json()
        printed = subprocess.run(
            [sys.executable, "-m", "reef", "status", "--url", gateway.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
        )
    isolation = status["tool_isolation"]
    assert isolation["boundary"] == "none"
    assert "bwrap is not installed" in isolation["detail"]
    assert printed.returncode == 0, printed.stderr
    assert "tool isolation: NONE, tools run unconfined: bwrap is not installed" in printed.stdout


@needs_bwrap
def test_with_the_boundary_the_status_names_it(tmp_path: Path) -> None:
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        isolation = call(gateway.port, "GET", "/reef/status").json()["tool_isolation"]
    assert isolation == {"boundary": "bwrap", "detail": BOUNDARY.detail}


@pytest.mark.usefixtures("no_bwrap")
def test_start_up_warns_without_a_boundary_and_hides_reefs_home(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reef.cli.serving import guard_tools

    monkeypatch.setattr(isolation_module, "_hidden", set())

    settings = make_settings(tmp_path, "http://127.0.0.1:9/v1")
    settings.home.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="reef.environments"):
        guard_tools(settings)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "reef.environments"]
    assert "tools of python environments will run without an OS boundary" in warning
    assert "bwrap is not installed (not on PATH); install bubblewrap" in warning
    assert "apt install bubblewrap" in warning
    assert isolation_module._hidden == {
        settings.home.absolute(),
        tmp_path / "reef.db",
        settings.home.absolute() / "artifacts",
    }

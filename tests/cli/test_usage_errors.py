"""Usage errors of the ``reef`` command: one line with a hint and exit 2, never a traceback.

Run as a user runs it (a real subprocess through ``reef.cli.main:main``), because the
error mapping lives in ``main`` and typer's test runner bypasses it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

from reef.cli.exits import run


def reef(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reef", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "says", "hint"),
    [
        (["releases", "list", "triage"], "unexpected extra argument", "releases list --help"),
        (["nosuchcmd"], "No such command 'nosuchcmd'", "reef --help"),
        (["releases", "list", "--limit", "abc"], "'--limit'", "releases list --help"),
        (["releases", "list", "--nope"], "No such option: --nope", "releases list --help"),
        (["export"], "Missing option '--scenario'", "export --help"),
        (["releases", "lsit"], "No such command 'lsit'", "releases --help"),
    ],
)
def test_a_usage_error_is_one_line_with_a_hint_and_exit_2(
    tmp_path: Path, args: list[str], says: str, hint: str
) -> None:
    result = reef(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and says in lines[0], lines[0]
    assert hint in lines[0], lines[0]
    assert not (tmp_path / ".reef").exists()


@pytest.mark.parametrize("args", [["releases"], [], ["jobs"], ["config"]])
def test_a_bare_group_prints_its_usage_and_exits_2(tmp_path: Path, args: list[str]) -> None:
    result = reef(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    shown = result.stdout + result.stderr
    assert "Usage:" in shown and "Commands" in shown


def test_help_exits_0(tmp_path: Path) -> None:
    result = reef("releases", "list", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--limit" in result.stdout


def test_a_command_exit_status_reaches_the_shell() -> None:
    """``raise typer.Exit(1)`` in a command (``reef engine serve`` when the engine
    fails) exits 1, not 0: ``run`` is what ``main`` calls."""
    app = typer.Typer()

    @app.command()
    def fail() -> None:
        raise typer.Exit(1)

    @app.command()
    def succeed() -> None:
        pass

    with pytest.raises(SystemExit) as failed:
        run(app, ["fail"])
    assert failed.value.code == 1
    with pytest.raises(SystemExit) as succeeded:
        run(app, ["succeed"])
    assert succeeded.value.code == 0

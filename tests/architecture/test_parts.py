"""The demo is a part of its own: ``reef.quickstart`` is reached only from the
``reef quickstart`` command, inside the command, so the product CLI loads none of it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "reef"
ENTRY_POINT = "cli/quickstart.py"


def _quickstart_imports(tree: ast.AST) -> list[ast.stmt]:
    found: list[ast.stmt] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        if any(name == "reef.quickstart" or name.startswith("reef.quickstart.") for name in names):
            found.append(node)
    return found


def test_only_the_command_imports_the_demo() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("quickstart/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = _quickstart_imports(tree)
        if rel == ENTRY_POINT:
            # Inside the command's body only: a module-level import would load the demo
            # with ``reef --help``.
            nodes = [node for node in nodes if node in tree.body]
        offenders += [f"{rel}:{node.lineno}" for node in nodes]
    assert not offenders, "only reef.cli.quickstart imports reef.quickstart, lazily:\n" + (
        "\n".join(offenders)
    )


@pytest.mark.parametrize("module", ["reef.cli", "reef.cli.main"])
def test_importing_the_cli_loads_no_demo(module: str) -> None:
    code = f"import sys, {module}\nprint(sorted(m for m in sys.modules if m.startswith('reef.')))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = done.stdout
    assert "'reef.cli.quickstart'" in loaded or module == "reef.cli"  # the command itself
    assert "'reef.quickstart'" not in loaded, f"import {module} loaded reef.quickstart"
    assert "reef.quickstart." not in loaded

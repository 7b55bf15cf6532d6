"""No test waits by sleeping: a fixed sleep is either too short on a loaded machine (a
flaky test) or too long everywhere else (a slow one).

A test that needs a state another thread or process brings about polls for it with
``tests/polling.py`` (the only module here that sleeps) or waits on a signal the code
gives (an event, a line on a pipe, a readiness method); time that a lease or trigger
measures comes from an injected clock the test moves. ``tests/fakes/`` may sleep: a fake
upstream's stall or slow stream is the thing it simulates. Checked on the source (AST),
so every spelling counts: ``time.sleep``, ``asyncio.sleep``, aliases and
``from time import sleep``. ``asyncio.sleep(0)`` is allowed: it hands the loop to the
other tasks once and waits for no time.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SLEEPING_MODULES = {"time", "asyncio", "trio", "anyio"}
POLLING_HELPER = TESTS / "polling.py"
FAKES = TESTS / "fakes"

# (file, enclosing function) -> why it may sleep. Only simulated work belongs here, never
# a wait for a condition; keep it short.
ALLOWED: dict[tuple[str, str], str] = {
    ("tests/learning/test_worker.py", "StampLearner.learn"): (
        "the test learner's `seconds` of work: the time a slow learner takes, which the "
        "cancel and kill tests interrupt"
    ),
    ("tests/upstream/test_http.py", "test_connection_refused_then_up_succeeds_on_retry"): (
        "the upstream is down for a moment before it starts: the outage is the scenario "
        "(the client offers no signal of a refused attempt to wait on)"
    ),
}


def _is_zero(node: ast.Call) -> bool:
    return (
        len(node.args) == 1
        and not node.keywords
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == 0
    )


class _SleepFinder(ast.NodeVisitor):
    """Lines and enclosing functions of every reference to a sleep function."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}  # local name -> the sleeping module it is
        self.functions: dict[str, str] = {}  # local name -> module of its sleep function
        self.scope: list[str] = []
        self.found: list[tuple[int, str]] = []
        self._zero_calls: set[int] = set()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in SLEEPING_MODULES:
                self.modules[alias.asname or alias.name] = alias.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module in SLEEPING_MODULES:
            for alias in node.names:
                if alias.name == "sleep":
                    self.functions[alias.asname or alias.name] = node.module

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        if _is_zero(node):
            self._zero_calls.add(id(node.func))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "sleep" and isinstance(node.value, ast.Name):
            self._found(node, self.modules.get(node.value.id))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self._found(node, self.functions.get(node.id))

    def _found(self, node: ast.expr, module: str | None) -> None:
        if module is None or (module == "asyncio" and id(node) in self._zero_calls):
            return
        self.found.append((node.lineno, ".".join(self.scope) or "<module>"))


def sleeps_in(source: str) -> list[tuple[int, str]]:
    """``(line, enclosing function)`` of each sleep in ``source`` (imports come first in
    the files checked, so one pass sees the names before their use)."""
    finder = _SleepFinder()
    finder.visit(ast.parse(source))
    return finder.found


def _checked_files() -> list[Path]:
    return [
        path
        for path in sorted(TESTS.rglob("*.py"))
        if path != POLLING_HELPER and FAKES not in path.parents
    ]


def test_the_finder_sees_every_spelling() -> None:
    source = (
        "import time, asyncio as aio\n"
        "from time import sleep as nap\n"
        "import asyncio\n"
        "def a():\n    time.sleep(1)\n"
        "async def b():\n    await aio.sleep(0.1)\n"
        "class C:\n    def d(self):\n        nap(2)\n"
        "async def e():\n    await asyncio.sleep(0)\n"  # a yield: allowed
        "wait = time.sleep\n"
    )
    assert sleeps_in(source) == [(5, "a"), (7, "b"), (10, "C.d"), (13, "<module>")]


def test_no_test_sleeps_outside_the_polling_helper_and_the_fakes() -> None:
    found: dict[tuple[str, str], list[int]] = {}
    for path in _checked_files():
        name = path.relative_to(ROOT).as_posix()
        for line, scope in sleeps_in(path.read_text(encoding="utf-8")):
            found.setdefault((name, scope), []).append(line)
    bad = [f"{name}:{lines[0]} in {scope}" for (name, scope), lines in found.items()]
    bad = [entry for entry, key in zip(bad, found, strict=True) if key not in ALLOWED]
    assert not bad, (
        "tests that sleep instead of waiting for what they need (use tests/polling.py's "
        "eventually, an event, or an injected clock): " + ", ".join(bad)
    )
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"allowed sleeps that are gone; drop them from ALLOWED: {stale}"

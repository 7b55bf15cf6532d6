"""No test compares elapsed wall time against a constant.

A bound on how long something took (``assert time.monotonic() - started < 5.0``) is
either too tight on a loaded machine (a flaky test) or too loose to catch a regression;
timings belong in ``bench/``. Where the behaviour matters (a timeout fires, a backoff
waits), a test injects a clock or a sleep and asserts what it was asked to wait, or
asserts the order of events.

Forbidden, checked on the source (AST) of every file under ``tests/``: a comparison
(``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``, chained or not) whose one side is an
elapsed-time expression and whose other side is a number other than zero. An
elapsed-time expression is

- a subtraction with a clock reading on either side: a call of ``monotonic``,
  ``perf_counter``, ``time`` (also their ``_ns`` forms and an event loop's ``time()``),
  or a name assigned from such a call in the same file;
- a name assigned from such a subtraction (``elapsed = time.monotonic() - started``),
  or a container one is stored in (``seen[port] = time.monotonic() - published``): an
  item of it, or ``max``/``min``/``sum`` of it or of its ``values()``;
- a name or attribute called ``elapsed``, ``duration`` or ``took``, alone or as a word
  of a snake-case name (``elapsed_s``, ``duration_ms``, ``took_seconds``);
- in a bound (``<``, ``<=``, ``>``, ``>=``) only, since an equality there is a stored
  value read back: a name or attribute with the word ``latency`` or ``wall``
  (``latency_ms``, ``wall_s``), or called ``seconds`` alone (a measured span's field,
  ``result.seconds``; ``retry_after_seconds`` is a wait asked for, not a span).

Comparing with zero stays allowed: ``duration_ms >= 0`` says a duration was measured
and cannot flake.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
CLOCK_FUNCTIONS = {
    "monotonic",
    "monotonic_ns",
    "perf_counter",
    "perf_counter_ns",
    "time",
    "time_ns",
}
TIMING_WORDS = {"elapsed", "duration", "took"}
SPAN_WORDS = {"latency", "wall"}  # in a bound only
SPAN_NAMES = {"seconds"}  # the whole name, in a bound only
_BOUNDS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_ORDERINGS = (*_BOUNDS, ast.Eq, ast.NotEq)
_AGGREGATES = {"max", "min", "sum"}


def _is_clock_call(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call) or node.args or node.keywords:
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in CLOCK_FUNCTIONS


def _is_timing_name(name: str) -> bool:
    return any(word in TIMING_WORDS for word in name.lower().split("_"))


def _is_span(node: ast.expr) -> bool:
    """A measured span by its name alone (``result.seconds``, ``latency_ms``)."""
    if isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Attribute):
        name = node.attr
    else:
        return False
    lowered = name.lower()
    return lowered in SPAN_NAMES or any(word in SPAN_WORDS for word in lowered.split("_"))


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
        and node.value != 0
    )


class _TimingFinder:
    """Lines of the comparisons of elapsed time against a constant in one module."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.readings: set[str] = set()  # names assigned a clock reading
        self.elapsed: set[str] = set()  # names assigned an elapsed-time expression
        self.containers: set[str] = set()  # names whose items are assigned one
        self._collect_names()

    def _collect_names(self) -> None:
        # Two passes: a reading's name is known before the subtraction that uses it.
        assigns = [node for node in ast.walk(self.tree) if isinstance(node, ast.Assign)]
        for node in assigns:
            if _is_clock_call(node.value):
                self.readings.update(_target_names(node))
        for node in assigns:
            if self._is_elapsed(node.value):
                self.elapsed.update(_target_names(node))
                self.containers.update(_container_names(node))

    def _is_reading(self, node: ast.expr) -> bool:
        return _is_clock_call(node) or (isinstance(node, ast.Name) and node.id in self.readings)

    def _is_elapsed(self, node: ast.expr) -> bool:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            return self._is_reading(node.left) or self._is_reading(node.right)
        if isinstance(node, ast.Name):
            return node.id in self.elapsed or _is_timing_name(node.id)
        if isinstance(node, ast.Attribute):
            return _is_timing_name(node.attr)
        if isinstance(node, ast.Subscript):
            return self._is_container(node.value)
        if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
            aggregate = isinstance(node.func, ast.Name) and node.func.id in _AGGREGATES
            return aggregate and self._is_container(node.args[0])
        return False

    def _is_timed(self, node: ast.expr, bound: bool) -> bool:
        return self._is_elapsed(node) or (bound and _is_span(node))

    def _is_container(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Call) and not node.args and isinstance(node.func, ast.Attribute):
            node = node.func.value if node.func.attr == "values" else node
        return isinstance(node, ast.Name) and node.id in self.containers

    def found(self) -> list[int]:
        lines = []
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides, sides[1:], strict=False):
                if not isinstance(op, _ORDERINGS):
                    continue
                bound = isinstance(op, _BOUNDS)
                if (self._is_timed(left, bound) and _is_number(right)) or (
                    self._is_timed(right, bound) and _is_number(left)
                ):
                    lines.append(node.lineno)
                    break
        return sorted(lines)


def _target_names(node: ast.Assign) -> set[str]:
    return {target.id for target in node.targets if isinstance(target, ast.Name)}


def _container_names(node: ast.Assign) -> set[str]:
    return {
        target.value.id
        for target in node.targets
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
    }


def timing_assertions_in(source: str) -> list[int]:
    """Lines of ``source`` that compare elapsed time against a nonzero number."""
    return _TimingFinder(ast.parse(source)).found()


def test_the_finder_sees_every_spelling_and_nothing_else() -> None:
    source = (
        "import time\n"
        "from time import perf_counter\n"
        "started = time.monotonic()\n"
        "assert time.monotonic() - started < 5.0\n"  # 4
        "assert 0.25 < time.monotonic() - started < 1.5\n"  # 5
        "t0 = perf_counter()\n"
        "spent = perf_counter() - t0\n"
        "assert spent <= 2\n"  # 8
        "assert result.duration_ms > 100\n"  # 9
        "assert 3 >= took\n"  # 10
        "assert loop.time() - began < -1\n"  # 11
        "assert elapsed_s == 1.0\n"  # 12
        "assert result.duration_ms >= 0\n"  # zero: allowed
        "assert count < 5\n"  # not a time
        "assert time.monotonic() - started < budget\n"  # not a constant
        "assert deadline - now > 1\n"  # neither side is a clock reading
        "assert durations[0] is None\n"  # not an ordering, nor a number
        "assert took is True\n"
        "seen[port] = time.monotonic() - started\n"
        "assert max(seen.values()) < 2.0\n"  # 20
        "assert seen[port] < 2.0\n"  # 21
        "assert len(seen) == 2\n"  # a count of them, not a time
        "timings['x'] = perf_counter() - t0\n"
        "print(timings)\n"  # recorded for a report, not compared
        "assert result.seconds < 5\n"  # 25
        "assert latency_ms <= 250\n"  # 26
        "assert exc.retry_after_seconds >= 1\n"  # a wait asked for, not a span measured
        "assert result.cpu_seconds > 0\n"  # zero
        "assert view.latency_ms == 987.25\n"  # a stored value read back
        "assert config.seconds == 0.5\n"
    )
    assert timing_assertions_in(source) == [4, 5, 8, 9, 10, 11, 12, 20, 21, 25, 26]


def test_no_test_compares_elapsed_time_against_a_constant() -> None:
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        for line in timing_assertions_in(path.read_text(encoding="utf-8")):
            bad.append(f"{path.relative_to(ROOT).as_posix()}:{line}")
    assert not bad, (
        "tests that compare elapsed wall time against a constant (they flake on a loaded "
        "machine; inject a clock or a sleep, or assert the order of events, and keep "
        "timings in bench/): " + ", ".join(bad)
    )

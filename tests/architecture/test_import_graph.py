"""The module import graph of ``src/reef`` and ``bench/``: no circles, and no private
name (one leading underscore) imported from another module.

Every import counts, a function's too (an import put off to call time is still a
dependency, and a circle through one only breaks when the order of first calls changes);
imports under ``if TYPE_CHECKING:`` do not, since they never run. ``from a import b``
where ``a.b`` is a module is an edge to that module. A package's ``__init__`` may import
private names of its own modules (it is their face).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
BENCH = ROOT / "bench"


def _module_files() -> dict[str, Path]:
    """Every module of ``reef`` and of ``bench`` by dotted name (a package by its own);
    hidden folders (the contenders' environments, ``bench/.venv-vllm``) are not ours."""
    files: dict[str, Path] = {}
    for base, top in ((SRC, SRC / "reef"), (ROOT, BENCH)):
        for path in sorted(top.rglob("*.py")):
            if any(part.startswith(".") for part in path.relative_to(top).parts):
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


MODULES = _module_files()
# Bench scripts run with ``bench/`` on ``sys.path`` and import each other by bare name.
BENCH_NAMES = {name.split(".", 1)[1] for name in MODULES if name.startswith("bench.")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from _import_nodes(ast.Module(body=node.orelse, type_ignores=[]))
            continue
        yield from _import_nodes(node)


def _known(name: str, importer: str) -> str | None:
    """The module of ours ``name`` means, seen from ``importer`` (None: not ours)."""
    if importer.startswith("bench.") and name.split(".")[0] in BENCH_NAMES:
        name = f"bench.{name}"
    return name if name in MODULES else None


def _absolute(node: ast.ImportFrom, importer: str) -> str:
    if not node.level:
        return node.module or ""
    package = importer.split(".")
    if MODULES[importer].name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _edges(importer: str) -> Iterator[tuple[str, str | None]]:
    """``(module, name)`` for each import of ``importer`` from a module of ours: ``name``
    is the non-module name imported from it, or None for the module itself."""
    tree = ast.parse(MODULES[importer].read_text(encoding="utf-8"))
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found = _known(alias.name, importer)
                if found:
                    yield found, None
            continue
        source = _absolute(node, importer)
        module = _known(source, importer)
        for alias in node.names:
            submodule = _known(f"{source}.{alias.name}", importer)
            if submodule:
                yield submodule, None
            elif module:
                yield module, alias.name


def _graph() -> dict[str, set[str]]:
    return {name: {m for m, _ in _edges(name) if m != name} for name in MODULES}


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other through imports."""
    reach = {node: _reach(graph, node) for node in graph}
    groups = {
        tuple(sorted({node} | {other for other in reach[node] if node in reach[other]}))
        for node in graph
        if node in reach[node]
    }
    return [list(group) for group in sorted(groups)]


def test_the_graph_sees_imports_of_every_kind() -> None:
    graph = _graph()
    assert "reef.core.errors" in graph["reef.environments.base"]  # from a.b import c
    assert "bench.sections" in graph["bench.engine_dtypes"]  # bench's bare names
    assert "reef.environments.tasks" in graph["reef.environments"]  # a package's face


def test_no_import_circles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_private_names_imported_across_modules() -> None:
    offenders = []
    for importer in MODULES:
        is_face = MODULES[importer].name == "__init__.py"
        for module, name in _edges(importer):
            if name is None or not name.startswith("_") or name.startswith("__"):
                continue
            if module == importer or (is_face and module.startswith(f"{importer}.")):
                continue
            offenders.append(f"{importer} imports {module}.{name}")
    assert not offenders, "make these public or move them:\n" + "\n".join(offenders)

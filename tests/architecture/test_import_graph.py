"""The module import graph of ``src/reef`` and ``bench/``: no circles, and no private
name (one leading underscore) imported from another module, nor reached on one as an
attribute (``orders._state = …`` after ``from … import orders``).

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

import pytest

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


def _module_aliases(importer: str, tree: ast.AST) -> dict[str, str]:
    """Names ``importer`` binds to modules of ours: ``import a.b as c`` binds ``c`` to
    ``a.b``, ``from a import b`` (a module) ``b`` to ``a.b``, and ``import a.b`` binds
    ``a``, a package of ours or not (``a.b`` is then read off the attribute chain)."""
    aliases: dict[str, str] = {}
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found = _known(alias.name, importer)
                    if found:
                        aliases[alias.asname] = found
                else:
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
            continue
        source = _absolute(node, importer)
        for alias in node.names:
            found = _known(f"{source}.{alias.name}", importer)
            if found:
                aliases[alias.asname or alias.name] = found
    return aliases


def _private_attributes(importer: str) -> Iterator[tuple[str, str]]:
    """``(module, name)`` for each private name of another module of ours that
    ``importer`` reads or sets as an attribute of that module."""
    tree = ast.parse(MODULES[importer].read_text(encoding="utf-8"))
    aliases = _module_aliases(importer, tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__"):  # a dunder is no one's private name
            continue
        chain: list[str] = []
        value: ast.expr = node.value
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in aliases:
            continue
        module = _known(".".join([aliases[value.id], *chain]), importer)
        if module and module != importer:
            yield module, node.attr


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


def test_private_attributes_are_seen_through_every_binding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "import reef.core.ids\n"
        "import reef.core.ids as ids_module\n"
        "from reef.core import ids\n"
        "reef.core.ids._a = 1\n"
        "ids_module._b()\n"
        "ids._c\n"
        "ids.__name__\n"  # a dunder is not private
        "ids.public\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    monkeypatch.setitem(MODULES, "reef.probe", path)
    found = sorted(_private_attributes("reef.probe"))
    assert found == [("reef.core.ids", "_a"), ("reef.core.ids", "_b"), ("reef.core.ids", "_c")]


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
        offenders += [f"{importer} uses {m}.{name}" for m, name in _private_attributes(importer)]
    assert not offenders, "make these public or move them:\n" + "\n".join(offenders)

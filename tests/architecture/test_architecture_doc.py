"""docs/architecture.md matches the code: its table of parts lists every top-level
package of ``src/reef`` and nothing else, each database table is owned by exactly one
part (the tables being the schema's, which the migrations create), and its table of
arrows is the imports each part has and the parts it must never import
(``test_boundaries.py``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from reef.db.schema import metadata
from tests.architecture.test_boundaries import FORBIDDEN, STORES

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "reef"
DOC = ROOT / "docs" / "architecture.md"
MIGRATIONS = SRC / "db" / "migrations" / "versions"
_NAME = re.compile(r"`([a-z_]+)`")


def markdown_table(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the table whose header row is ``header``."""
    lines = text.splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _names(cell: str) -> list[str]:
    """The backticked names of a cell, up to any parenthesis (a remark)."""
    return _NAME.findall(cell.split("(")[0])


def _parts_table() -> list[list[str]]:
    return markdown_table(DOC.read_text(encoding="utf-8"), "| part | owns | tables |")


def _packages() -> set[str]:
    return {path.parent.name for path in SRC.glob("*/__init__.py")}


def _imported_parts(package: str, parts: set[str]) -> set[str]:
    found = set()
    for path in (SRC / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                bits = name.split(".")
                if bits[0] == "reef" and len(bits) > 1 and bits[1] in parts - {package}:
                    found.add(bits[1])
    return found


def _migrated_tables() -> set[str]:
    """The tables the migrations' ``upgrade`` functions leave, in revision order."""
    tables: set[str] = set()
    for path in sorted(MIGRATIONS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in tree.body:
            if not (isinstance(function, ast.FunctionDef) and function.name == "upgrade"):
                continue
            for node in ast.walk(function):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                first = node.args[0] if node.args else None
                if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                    continue
                if node.func.attr == "create_table":
                    tables.add(first.value)
                elif node.func.attr == "drop_table":
                    tables.discard(first.value)
    return tables


def test_the_table_of_parts_lists_every_package_and_no_other() -> None:
    listed = [_names(row[0]) for row in _parts_table()]
    assert all(len(names) == 1 for names in listed), listed
    parts = [names[0] for names in listed]
    assert len(parts) == len(set(parts)), f"a part is listed twice: {parts}"
    packages = _packages()
    assert not packages - set(parts), f"packages missing from the doc: {packages - set(parts)}"
    assert not set(parts) - packages, f"listed parts with no package: {set(parts) - packages}"


def test_every_table_has_exactly_one_owner() -> None:
    owners: dict[str, list[str]] = {}
    for part, _owns, tables in _parts_table():
        for table in _names(tables):
            owners.setdefault(table, []).append(_names(part)[0])
    schema = set(metadata.tables)
    assert _migrated_tables() == schema, "the migrations and reef.db.schema disagree"
    assert not schema - set(owners), f"tables with no owner in the doc: {schema - set(owners)}"
    assert not set(owners) - schema, f"listed tables not in the schema: {set(owners) - schema}"
    shared = {table: parts for table, parts in owners.items() if len(parts) > 1}
    assert not shared, f"tables owned by more than one part: {shared}"


def _arrows() -> list[list[str]]:
    return markdown_table(DOC.read_text(encoding="utf-8"), "| part | imports | never imports |")


def test_the_arrows_are_the_imports_of_the_code() -> None:
    packages = _packages()
    documented = {_names(part)[0]: set(_names(imports)) for part, imports, _ in _arrows()}
    assert set(documented) == packages, set(documented) ^ packages
    wrong = [
        f"{part}: the doc says {sorted(documented[part])}, the code imports {sorted(actual)}"
        for part in sorted(packages)
        if documented[part] != (actual := _imported_parts(part, packages))
    ]
    assert not wrong, "update the arrows in docs/architecture.md:\n" + "\n".join(wrong)


def _never(part: str, cell: str, packages: set[str]) -> set[str]:
    """The parts of reef a "never imports" cell names ("every other part but `x`")."""
    if cell.startswith("every other part"):
        return packages - {part} - set(_NAME.findall(cell))
    return set(_names(cell)) & packages


def test_the_forbidden_arrows_are_the_boundary_tests() -> None:
    packages = _packages()
    wrong = []
    for part_cell, _, never_cell in _arrows():
        part = _names(part_cell)[0]
        tested = FORBIDDEN.get(part, set()) & packages
        if part in STORES:
            tested |= set(STORES) - {part}
        if _never(part, never_cell, packages) != tested:
            wrong.append(f"{part}: the doc says {never_cell}, the tests forbid {sorted(tested)}")
    assert not wrong, "\n".join(wrong)


def test_the_table_reader_reads_cells_and_stops_at_the_tables_end() -> None:
    text = "| a | b |\n|---|---|\n| `x` | `y` (one), `z` |\n\nafter\n| `q` | `r` |"
    assert markdown_table(text, "| a | b |") == [["`x`", "`y` (one), `z`"]]
    assert _names("`y` (one), `z`") == ["y"]

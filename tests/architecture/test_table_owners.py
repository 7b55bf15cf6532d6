"""Each store answers questions about its own tables: outside ``reef.db``, a table of
``reef.db.schema`` is queried only by the package that owns it. Another part asks the
owner through its face (``jobs/queue.py`` once counted feedback rows and joined the
candidates table itself; the experience store's ``new_feedback_count`` and the releases
store's ``published_candidate_ids`` answer those now)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from reef.db import schema

SRC = Path(__file__).resolve().parents[2] / "src" / "reef"

OWNERS: dict[str, str] = {
    "records": "experience",
    "feedback": "experience",
    "feedback_refs": "experience",
    "responses": "experience",
    "spend_windows": "experience",
    "idempotency_claims": "experience",
    "scenarios": "releases",
    "artifacts": "releases",
    "candidates": "releases",
    "releases": "releases",
    "heads": "releases",
    "jobs": "jobs",
    "consumed": "jobs",
    "evaluations": "evaluation",
    "eval_results": "evaluation",
    "eval_episodes": "evaluation",
    "eval_items": "evaluation",
}

# Crossings that predate this rule, each still to move behind its owner's face. The list
# only shrinks: a crossing not named here fails, and so does one named here that is gone.
KNOWN: set[tuple[str, str]] = {
    # A record naming a new scenario inserts its row (if absent) in the record's own
    # transaction (on SQLite's plain-sqlite3 path too); the store's write probe writes
    # and deletes a scratch one.
    ("experience/sql/store.py", "scenarios"),
    ("experience/sql/sqlite_records.py", "scenarios"),
}


# A table named in raw SQL text (``INSERT OR IGNORE INTO scenarios …``, ``FROM records``):
# the keywords upper-case, as SQL is written here and prose is not.
_RAW_SQL = re.compile(r"\b(?:INTO|FROM|JOIN|UPDATE)\s+([a-z_]+)\b")


def _tables_used(path: Path) -> set[str]:
    """Tables of ``reef.db.schema`` that ``path`` names: ``t.feedback`` after
    ``from reef.db import schema as t``, a table imported by name, or a table a string of
    raw SQL names (``INTO``, ``FROM``, ``JOIN``, ``UPDATE``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            used |= {name for name in _RAW_SQL.findall(node.value) if name in OWNERS}
        if isinstance(node, ast.ImportFrom) and node.module == "reef.db":
            aliases |= {a.asname or a.name for a in node.names if a.name == "schema"}
        elif isinstance(node, ast.ImportFrom) and node.module == "reef.db.schema":
            used |= {a.name for a in node.names if a.name in OWNERS}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == "reef.db.schema" and a.asname}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr in OWNERS
        ):
            used.add(node.attr)
    return used


def _crossings() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("db/"):
            continue
        package = rel.split("/")[0]
        found |= {(rel, table) for table in _tables_used(path) if OWNERS[table] != package}
    return found


def test_every_table_has_an_owner() -> None:
    assert set(schema.metadata.tables) == set(OWNERS)


def test_the_detector_sees_a_stores_own_tables() -> None:
    assert _tables_used(SRC / "jobs" / "queue.py") == {"jobs", "consumed"}


def test_the_detector_reads_raw_sql(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        'A = "INSERT OR IGNORE INTO scenarios (name) VALUES (?)"\n'
        'B = "SELECT max(turn) FROM records r JOIN feedback_refs f ON f.record_id = r.id"\n'
        'C = """Turning exchanges into records, read from feedback."""\n',  # prose
        encoding="utf-8",
    )
    assert _tables_used(probe) == {"scenarios", "records", "feedback_refs"}


def test_no_module_queries_another_parts_table() -> None:
    crossings = _crossings()
    new = sorted(crossings - KNOWN)
    assert not new, "ask the owning store through its face instead:\n" + "\n".join(
        f"{rel} queries {table} ({OWNERS[table]}'s)" for rel, table in new
    )
    gone = sorted(KNOWN - crossings)
    assert not gone, f"these crossings are gone; strike them from KNOWN: {gone}"

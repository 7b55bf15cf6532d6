"""Every earlier schema, filled with rows, upgrades to head and reads back through the
stores (experience, responses, release chain, jobs, evaluations) on SQLite and
PostgreSQL. The stores are built as the composition root builds them: one ``Database``,
each store on it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect

from reef.config.spend import BudgetLimit
from reef.core import loads
from reef.db import Database
from reef.db.engine import create_store_engine
from reef.db.migrations import VERSION_TABLE, known_revisions, upgrade
from reef.evaluation import EvaluationStore
from reef.experience import (
    IdempotencyClaims,
    Line,
    ResponseStore,
    SQLExperienceStore,
    StoreLedger,
)
from reef.jobs import JobQueue
from reef.releases import ReleaseChain
from reef.releases.manifest import ReleaseManifest
from tests.db.revision_fixtures import (
    MANIFEST,
    REVISIONS,
    ROWS,
    SCENARIO,
    Row,
    build_store,
    expected_row,
    tables_at,
)
from tests.experience.conftest import ThrowawayDatabases

BACKENDS = [pytest.param("sqlite"), pytest.param("postgresql", marks=pytest.mark.postgres)]

# Columns no store hands back: what they hold is checked some other way (said here).
UNREAD = {
    "feedback": {"body_hash"},  # the idempotency comparison's; the refs come as record_ids
    "candidates": {"manifest_json"},  # compared as a ReleaseManifest below
    "releases": {"manifest_json"},
}
# Faces that name a JSON column otherwise than "<column> without _json".
RENAMED = {
    "responses": {"input_json": "input_items"},
    "candidates": {"eval_json": "evidence"},
    "releases": {"eval_json": "evidence"},
}


def test_every_revision_has_a_fixture() -> None:
    """A new migration is not done until tests/db/revision_fixtures.py fills it."""
    missing = [name for name in known_revisions() if name not in REVISIONS]
    assert missing == [], f"add a RevisionFixture for {missing} to tests/db/revision_fixtures.py"
    assert sorted(REVISIONS) == known_revisions()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'reef.db'}"
    databases: ThrowawayDatabases = request.getfixturevalue("pg_databases")
    return databases.create()


@pytest.fixture
def database(store_url: str) -> Iterator[Database]:
    database = Database(create_store_engine(store_url))
    yield database
    database.close()


@pytest.mark.parametrize("revision", known_revisions())
def test_a_store_at_each_revision_upgrades_and_reads_back(
    database: Database, revision: str
) -> None:
    build_store(database.engine, revision)
    assert _schema(database) == tables_at(revision), (
        f"revision {revision} changed tables or columns its RevisionFixture does not name"
    )
    upgrade(database.engine)
    found = _read_back(database, tables_at(revision))
    for table, rows in found.items():
        expected = [_decoded(table, expected_row(table, row, revision)) for row in ROWS[table]]
        for wanted, got in zip(expected, rows, strict=True):
            assert {k: got[k] for k in wanted if k in got} == {
                k: v for k, v in wanted.items() if k in got
            }, table
            assert set(wanted) - set(got) <= UNREAD.get(table, set()), table


def _schema(database: Database) -> dict[str, set[str]]:
    with database.engine.connect() as conn:
        inspector = inspect(conn)
        return {
            name: {column["name"] for column in inspector.get_columns(name)}
            for name in inspector.get_table_names()
            if name != VERSION_TABLE
        }


def _decoded(table: str, row: Row) -> Row:
    """``row`` as the stores name and parse it: JSON columns parsed, ``_json`` dropped."""
    out: Row = {}
    renamed = RENAMED.get(table, {})
    for column, value in row.items():
        if column in renamed:
            out[renamed[column]] = None if value is None else loads(value)
        elif column.endswith("_json") and column not in UNREAD.get(table, set()):
            out[column.removesuffix("_json")] = None if value is None else loads(value)
        else:
            out[column] = value
    return out


def _fields(view: Any) -> Row:
    return dataclasses.asdict(view)


def _read_back(database: Database, tables: dict[str, set[str]]) -> dict[str, list[Row]]:
    """Every fixture row of ``tables`` as the stores return it, by table."""
    experience = SQLExperienceStore(database)
    chain = ReleaseChain(database)
    jobs = JobQueue(database)
    evaluations = EvaluationStore(database)
    found: dict[str, list[Row]] = {
        "records": [_fields(experience.get_record(r["id"])) for r in ROWS["records"]],
        "feedback": [_fields(experience.get_feedback(r["id"])) for r in ROWS["feedback"]],
        "candidates": [_fields(chain.get_candidate(r["id"])) for r in ROWS["candidates"]],
        "releases": [_fields(chain.get_release(r["id"])) for r in ROWS["releases"]],
        "jobs": [_fields(jobs.get(r["id"])) for r in ROWS["jobs"]],
    }
    for candidate in [*found["candidates"], *found["releases"]]:
        assert candidate["manifest"] == ReleaseManifest.from_json(MANIFEST)
    head = chain.head(SCENARIO)
    assert head is not None
    found["heads"] = [{"scenario": head.scenario, "release_id": head.id, "seq": head.seq}]
    assert [s.name for s in chain.scenarios()] == [SCENARIO]
    refs = {r["id"]: experience.get_feedback(r["id"]).record_ids for r in ROWS["feedback"]}
    found["feedback_refs"] = [
        {**ref, "position": refs[ref["feedback_id"]].index(ref["record_id"])}
        for ref in ROWS["feedback_refs"]
    ]
    found["consumed"] = [
        {"record_id": record_id, "job_id": "job-1"} for record_id in jobs.consumed_by("job-1")
    ]
    if "evaluations" in tables:
        found.update(_evaluations(evaluations, "episodes" in tables))
    if "responses" in tables:
        responses = ResponseStore(database)
        found["responses"] = [_fields(responses.get(r["id"])) for r in ROWS["responses"]]
    if "spend_windows" in tables:
        found["spend_windows"] = [_spend_window(database, row) for row in ROWS["spend_windows"]]
    if "idempotency_claims" in tables:
        claims = IdempotencyClaims(database)
        found["idempotency_claims"] = [
            dataclasses.asdict(claims.held(row["scenario"], row["key"]))  # type: ignore[arg-type]
            for row in ROWS["idempotency_claims"]
        ]
    experience.close()
    return found


def _spend_window(database: Database, row: Row) -> Row:
    """A ``spend_windows`` row as the budget ledger reads it."""
    budget, window = row["budget"].rsplit("/", 1)
    limit = BudgetLimit(window=window, tokens=1)
    tokens, money = asyncio.run(
        StoreLedger(database).spent(Line(budget, limit, row["window_start"]))
    )
    return {**row, "tokens": tokens, "money": money}


def _evaluations(store: EvaluationStore, with_episodes: bool) -> dict[str, list[Row]]:
    found = {
        "evaluations": [_fields(store.get(r["id"])) for r in ROWS["evaluations"]],
        "eval_items": [
            {"evaluation_id": "eval-1", "item_key": item.key, "suite": item.suite, "item": item}
            for item in store.items("eval-1")
        ],
        "eval_results": [
            {"evaluation_id": "eval-1", **_fields(result)} for result in store.results("eval-1")
        ],
    }
    for row in found["eval_items"]:
        row["item"] = row["item"].as_dict()
    if with_episodes:
        found["eval_episodes"] = [
            {"evaluation_id": "eval-1", **_fields(episode)} for episode in store.episodes("eval-1")
        ]
    return found

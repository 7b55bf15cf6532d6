"""Stores at every schema revision, filled with rows, for the upgrade tests.

``build_store(engine, revision)`` runs the real migrations up to ``revision`` and inserts,
with plain SQL naming only the columns that revision has, rows in every table that exists
there: records in two sessions (a two-turn chat and an Anthropic message), feedback with
refs, a correction and trust, a candidate, releases and the head, a job and what it
consumed, an evaluation with its items, results and episodes, a stored response, an
idempotency claim.

``ROWS`` holds every row with every column of the newest schema; ``REVISIONS`` says, for
each revision, the tables it creates and the columns it adds to older tables, with the
value the migration gives those columns on rows written before it (``None`` unless
said). From these, a row written at revision N reads back after the upgrade as
``expected_row``. A new migration is not done until it has its entry here: the upgrade
test fails for a revision in ``versions/`` without one, and for a revision whose tables
and columns differ from what its entry says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from reef.core import dumps
from reef.db.migrations import upgrade

Row = dict[str, Any]
Backfill = Callable[[Row], Any]


def _null(row: Row) -> Any:
    return None


@dataclass(frozen=True)
class RevisionFixture:
    """What one revision brings: ``creates`` the tables it creates; ``adds`` per table
    the columns it adds, each with how the migration fills it on older rows."""

    creates: tuple[str, ...] = ()
    adds: Mapping[str, Mapping[str, Backfill]] = field(default_factory=dict)


def _trust(row: Row) -> str:
    return "operator" if row["principal"] is None else "user"


def _nulls(*columns: str) -> dict[str, Backfill]:
    return dict.fromkeys(columns, _null)


REVISIONS: dict[str, RevisionFixture] = {
    "0001": RevisionFixture(
        creates=(
            "scenarios",
            "records",
            "feedback",
            "feedback_refs",
            "artifacts",
            "candidates",
            "releases",
            "heads",
            "jobs",
            "consumed",
        )
    ),
    "0002": RevisionFixture(
        adds={
            "releases": _nulls("reason", "candidate_id", "rolled_back_to"),
            # updated_at stays null; the chain reads such a candidate's as its created_at.
            "candidates": {
                **_nulls("created_by", "reason"),
                "updated_at": lambda row: row["created_at"],
            },
        }
    ),
    "0003": RevisionFixture(adds={"records": _nulls("rendered_request_json")}),
    "0004": RevisionFixture(
        adds={
            "jobs": {
                **_nulls("progress", "message", "error", "candidate_id"),
                # null in the table; the queue reads them as empty
                "logs_json": lambda row: "[]",
                "metrics_json": lambda row: "{}",
            }
        }
    ),
    "0005": RevisionFixture(creates=("evaluations", "eval_results", "eval_items")),
    "0006": RevisionFixture(
        adds={
            "feedback": {
                "trust": _trust,
                **_nulls("quarantine_reason", "quarantined_at", "released_at", "released_by"),
            }
        }
    ),
    "0007": RevisionFixture(creates=("responses",)),
    "0008": RevisionFixture(adds={"feedback": _nulls("session_id")}),
    "0009": RevisionFixture(
        adds={"feedback": {"source": lambda row: "explicit", "confidence": _null}}
    ),
    "0010": RevisionFixture(creates=("eval_episodes",)),
    "0011": RevisionFixture(
        adds={"records": _nulls("cost", "price_json")}, creates=("spend_windows",)
    ),
    "0012": RevisionFixture(adds={"records": _nulls("weights_digest")}),
    "0013": RevisionFixture(creates=("idempotency_claims",)),
    "0014": RevisionFixture(),  # drops an index: no table or column changes
}


def _at(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, 30, 15, 250000, tzinfo=UTC)


def _json(value: Any) -> str:
    return dumps(value).decode()


SCENARIO = "support"
MANIFEST = {"schema_version": 1, "model": {"base": "tiny-model"}}
_CHAT_1 = {"model": "reef/support", "messages": [{"role": "user", "content": "hi"}]}
_ANSWER_1 = {"choices": [{"message": {"role": "assistant", "content": "hello"}}]}
_CHAT_2 = {
    "model": "reef/support",
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "what is 2+2?"},
    ],
}
_ANTHROPIC = {
    "model": "reef/support",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "name a colour"}],
}
_ANTHROPIC_ANSWER = {
    "type": "message",
    "role": "assistant",
    "content": [{"type": "text", "text": "teal"}],
    "usage": {"input_tokens": 4, "output_tokens": 1},
}


def _record(number: int, session: str, turn: int, api: str, request: Any, response: Any) -> Row:
    return {
        "id": f"rec-{number}",
        "scenario": SCENARIO,
        "session_id": session,
        "turn": turn,
        "release_id": "rel-1",
        "api": api,
        "request_json": _json(request),
        "rendered_request_json": _json({**request, "temperature": 0.2}),
        "response_json": _json(response),
        "status": "ok",
        "error": None,
        "latency_ms": 12.5 + number,
        "usage_json": _json({"prompt_tokens": 3, "completion_tokens": number}),
        "cost": 0.25 * number,
        "price_json": _json({"model": "m", "input_per_mtok": 1.0, "output_per_mtok": 2.0}),
        "weights_digest": "sha256:" + f"{number:064x}",
        "prompt_hash": f"sha256:{'a' * 63}{number}",
        "content_hash": f"sha256:{'b' * 63}{number}",
        "continuation_hash": f"sha256:{'c' * 63}{number}",
        "tags_json": _json({"team": "blue"}),
        "principal": None if number == 1 else "alice",
        "purpose": "serve",
        "idempotency_key": f"key-{number}",
        "created_at": _at(1, number),
    }


def _feedback(number: int, principal: str | None, **values: Any) -> Row:
    row: Row = {
        "id": f"fb-{number}",
        "scenario": SCENARIO,
        "score": None,
        "feedback_json": None,
        "correction_json": None,
        "metadata_json": _json({"via": "fixture"}),
        "principal": principal,
        "trust": "operator" if principal is None else "user",
        "idempotency_key": None,
        "body_hash": f"sha256:{'d' * 63}{number}",
        "created_at": _at(2, number),
        "quarantine_reason": None,
        "quarantined_at": None,
        "released_at": None,
        "released_by": None,
        "session_id": None,
        "source": "explicit",
        "confidence": None,
    }
    row.update(values)
    return row


_ITEM = {
    "id": "q1",
    "suite": "file:basic",
    "messages": [{"role": "user", "content": "2+2?"}],
    "reference": "4",
    "scorer": None,
    "tags": [],
    "params": {},
    "provenance": {"source": "file", "trust": "operator", "authors": []},
}

ROWS: dict[str, list[Row]] = {
    "scenarios": [{"name": SCENARIO, "created_at": _at(1), "config_json": None}],
    "records": [
        _record(1, "sess-chat", 0, "openai.chat", _CHAT_1, _ANSWER_1),
        _record(2, "sess-chat", 1, "openai.chat", _CHAT_2, _ANSWER_1),
        _record(3, "sess-msg", 0, "anthropic.messages", _ANTHROPIC, _ANTHROPIC_ANSWER),
    ],
    "feedback": [
        _feedback(
            1,
            None,
            score=0.0,
            feedback_json=_json({"comment": "wrong sum"}),
            correction_json=_json("4"),
            idempotency_key="fb-key-1",
        ),
        _feedback(
            2,
            "alice",
            score=1.0,
            trust="untrusted",
            quarantine_reason="outlier",
            quarantined_at=_at(3),
            released_at=_at(4),
            released_by="admin",
            session_id="sess-msg",
            source="signal:thumbs",
            confidence=0.75,
        ),
    ],
    "feedback_refs": [
        {"feedback_id": "fb-1", "record_id": "rec-1", "position": 0},
        {"feedback_id": "fb-1", "record_id": "rec-2", "position": 1},
        {"feedback_id": "fb-2", "record_id": "rec-3", "position": 0},
    ],
    "artifacts": [
        {
            "digest": f"sha256:{'e' * 64}",
            "kind": "harness",
            "uri": "file:///artifacts/e",
            "size_bytes": 2048,
            "created_at": _at(1),
            "meta_json": None,
        }
    ],
    "candidates": [
        {
            "id": "cand-1",
            "scenario": SCENARIO,
            "parent_release_id": "rel-1",
            "manifest_json": _json(MANIFEST),
            "state": "published",
            "eval_json": _json({"win_rate": 0.8}),
            "created_at": _at(5),
            "created_by": "worker-1",
            "reason": "learned from feedback",
            "updated_at": _at(6),
        }
    ],
    "releases": [
        {
            "id": "rel-1",
            "scenario": SCENARIO,
            "seq": 1,
            "parent_id": None,
            "operation": "create",
            "manifest_json": _json(MANIFEST),
            "eval_json": None,
            "created_by": "config",
            "created_at": _at(1),
            "reason": "init",
            "candidate_id": None,
            "rolled_back_to": None,
        },
        {
            "id": "rel-2",
            "scenario": SCENARIO,
            "seq": 2,
            "parent_id": "rel-1",
            "operation": "publish",
            "manifest_json": _json(MANIFEST),
            "eval_json": _json({"win_rate": 0.8}),
            "created_by": "worker-1",
            "created_at": _at(6),
            "reason": "gate passed",
            "candidate_id": "cand-1",
            "rolled_back_to": None,
        },
    ],
    "heads": [{"scenario": SCENARIO, "release_id": "rel-2", "seq": 2}],
    "jobs": [
        {
            "id": "job-1",
            "scenario": SCENARIO,
            "kind": "learn",
            "state": "done",
            "lease_owner": None,
            "lease_until": None,
            "attempt": 1,
            "input_json": _json({"trigger": "manual"}),
            "result_json": _json({"candidate": "cand-1"}),
            "created_at": _at(5),
            "updated_at": _at(6),
            "progress": 1.0,
            "message": "done",
            "error": None,
            "logs_json": _json(["started", "done"]),
            "metrics_json": _json({"loss": [0.5, 0.25]}),
            "candidate_id": "cand-1",
        }
    ],
    "consumed": [{"record_id": "rec-1", "job_id": "job-1"}],
    "evaluations": [
        {
            "id": "eval-1",
            "scenario": SCENARIO,
            "candidate_id": "cand-1",
            "baseline_id": "rel-1",
            "state": "done",
            "verdict": "better",
            "decision_json": _json({"verdict": "better", "p": 0.01}),
            "meta_json": _json({"repeats": 1}),
            "created_by": "worker-1",
            "created_at": _at(5, 1),
            "finished_at": _at(5, 2),
        }
    ],
    "eval_items": [
        {
            "evaluation_id": "eval-1",
            "item_key": "file:basic/q1",
            "suite": "file:basic",
            "item_json": _json(_ITEM),
        }
    ],
    "eval_results": [
        {
            "evaluation_id": "eval-1",
            "item_key": "file:basic/q1",
            "arm": arm,
            "repeat": 0,
            "suite": "file:basic",
            "score": score,
            "record_id": "rec-1",
            "output": answer,
            "error": None,
            "details_json": _json({"scorer": "exact"}),
            "latency_ms": 30.0,
        }
        for arm, score, answer in (("baseline", 0.0, "5"), ("candidate", 1.0, "4"))
    ],
    "spend_windows": [
        {
            "budget": f"scenario:{SCENARIO}/month",
            "window_start": _at(1),
            "tokens": 1234,
            "money": 0.75,
        }
    ],
    "eval_episodes": [
        {
            "evaluation_id": "eval-1",
            "item_key": "env:calc/t1",
            "arm": "candidate",
            "repeat": 0,
            "task_id": "t1",
            "release_id": "cand-1",
            "environment": "calc",
            "score": 1.0,
            "stop": "done",
            "reason": "solved",
            "error": None,
            "turns": 2,
            "tool_calls": 1,
            "tool_status_json": _json({"ok": 1}),
            "session_id": "sess-ep",
            "record_ids_json": _json(["rec-2"]),
            "messages_json": _json([{"role": "user", "content": "2+2?"}]),
            "seconds": 1.5,
        }
    ],
    "idempotency_claims": [
        {
            "scenario": SCENARIO,
            "key": "key-in-flight",
            "request_hash": "f" * 64,
            "owner": "host:1234:rec-9",
            "claimed_at": _at(8),
            "expires_at": _at(8, 1),
        }
    ],
    "responses": [
        {
            "id": "resp_1",
            "scenario": SCENARIO,
            "session_id": "sess-chat",
            "record_id": "rec-2",
            "previous_response_id": None,
            "principal": "alice",
            "input_json": _json([{"id": "msg_1", "role": "user", "content": "hi"}]),
            "response_json": _json({"id": "resp_1", "object": "response", "output": []}),
            "created_at": _at(1, 2),
        }
    ],
}


def revisions_through(revision: str) -> list[str]:
    """The fixture's revisions up to and including ``revision``, oldest first."""
    ordered = sorted(REVISIONS)
    return ordered[: ordered.index(revision) + 1]


def tables_at(revision: str) -> dict[str, set[str]]:
    """Each table that exists at ``revision`` and its columns, by ``REVISIONS``."""
    later = [name for name in sorted(REVISIONS) if name > revision]
    tables: dict[str, set[str]] = {}
    for name in revisions_through(revision):
        for table in REVISIONS[name].creates:
            tables[table] = set(ROWS[table][0])
    for name in later:
        for table, columns in REVISIONS[name].adds.items():
            if table in tables:
                tables[table] -= set(columns)
    return tables


def expected_row(table: str, row: Row, revision: str) -> Row:
    """``row`` as written at ``revision``, after the upgrade to head: the columns added
    later hold what their migration gave them."""
    expected = dict(row)
    for name in sorted(REVISIONS):
        if name > revision:
            for column, backfill in REVISIONS[name].adds.get(table, {}).items():
                expected[column] = backfill(row)
    return expected


def build_store(engine: Engine, revision: str) -> None:
    """Migrate the empty database behind ``engine`` to ``revision`` and fill it."""
    upgrade(engine, revision)
    insert_rows(engine, revision, ROWS)


def insert_rows(engine: Engine, revision: str, rows: Mapping[str, list[Row]]) -> None:
    """Insert ``rows`` (by table, parents first) into a store at ``revision``, naming
    only the columns that revision has."""
    tables = tables_at(revision)
    with engine.begin() as conn:
        for table, table_rows in rows.items():
            if table not in tables or not table_rows:
                continue
            columns = sorted(tables[table])
            target = sa.table(table, *(sa.column(c, _type(c)) for c in columns))
            conn.execute(sa.insert(target), [{c: row[c] for c in columns} for row in table_rows])


def traffic(chats: int, feedback: int) -> dict[str, list[Row]]:
    """More rows like an earlier Reef's users left: ``chats`` two-turn chats (two
    records each) and ``feedback`` rows with corrections, each about one chat's turns
    (ids ``chat-<n>-<turn>`` and ``fbk-<n>``), for a store ``build_store`` filled."""
    records = [
        {
            **_record(
                3 + turn, f"chat-{n}", turn, "openai.chat", (_CHAT_1, _CHAT_2)[turn], _ANSWER_1
            ),
            "id": f"chat-{n}-{turn}",
            "idempotency_key": None,
            "created_at": _at(7, n % 24),
        }
        for n in range(chats)
        for turn in (0, 1)
    ]
    notes = [
        _feedback(3, None, id=f"fbk-{n}", score=0.0, correction_json=_json(f"answer {n}"))
        for n in range(feedback)
    ]
    refs = [
        {"feedback_id": f"fbk-{n}", "record_id": f"chat-{n}-{turn}", "position": turn}
        for n in range(feedback)
        for turn in (0, 1)
    ]
    return {"records": records, "feedback": notes, "feedback_refs": refs}


def _type(column: str) -> sa.types.TypeEngine[Any]:
    # Timestamps need the dialect's own format (SQLite stores text); the rest binds as is.
    if column.endswith("_at") or column in ("lease_until", "window_start"):
        return sa.DateTime(timezone=True)
    return sa.types.NullType()

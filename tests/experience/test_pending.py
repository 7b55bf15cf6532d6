"""Pending records: a stream's row is stored before its receipt leaves, its end writes
the outcome over it, and rows a dead gateway left pending are settled at the next start.
On SQLite (the plain ``sqlite3`` path) and PostgreSQL (the Core path)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from reef.experience import SQLExperienceStore
from reef.experience.sql.rows import PENDING_SETTLED
from tests.experience.conftest import DraftFactory

OK_REPLY = {"choices": [{"message": {"role": "assistant", "content": "done"}}]}


def test_the_outcome_finishes_the_pending_row_in_its_turn(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    first = make_draft(session_id="s")
    streaming = make_draft(session_id="s", status="pending", response=None, usage=None)
    store.write_records([first, streaming])
    pending = store.get_record(streaming.id)
    assert (pending.status, pending.turn, pending.response) == ("pending", 1, None)
    later = make_draft(session_id="s")  # a turn that arrived while the stream ran
    store.write_records([later])

    outcome = dataclasses.replace(
        streaming,
        status="ok",
        response=OK_REPLY,
        usage={"completion_tokens": 1},
        latency_ms=99.0,
        content_hash="sha256:" + "c" * 64,
        continuation_hash="sha256:" + "d" * 64,
        idempotency_key="key-1",
        finishes_pending=True,
    )
    assert store.write_records([outcome]) == [streaming.id]

    done = store.get_record(streaming.id)
    assert (done.status, done.response, done.latency_ms) == ("ok", OK_REPLY, 99.0)
    assert done.usage == {"completion_tokens": 1}
    assert done.content_hash == "sha256:" + "c" * 64
    assert (done.turn, done.created_at) == (pending.turn, pending.created_at)
    assert [r.id for r in store.get_session("support", "s")] == [first.id, streaming.id, later.id]
    assert store.find_by_idempotency_key("support", "key-1") == streaming.id
    # Its continuation now joins later requests to the session.
    match = store.find_session("support", ["sha256:" + "d" * 64])
    assert match is not None and match.record_id == streaming.id


def test_a_pending_row_and_its_outcome_in_one_batch_store_the_outcome(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    """An async writer's batch can hold a short stream's start and its end: the row is
    stored once, finished, under its key (the end was once dropped, the row left
    pending without the key)."""
    first = make_draft(session_id="s")
    streaming = make_draft(session_id="s", status="pending", response=None, usage=None)
    outcome = dataclasses.replace(
        streaming,
        status="ok",
        response=OK_REPLY,
        latency_ms=42.0,
        idempotency_key="key-batched",
        finishes_pending=True,
    )
    after = make_draft(session_id="s")
    ids = store.write_records([first, streaming, outcome, after])
    assert ids == [first.id, streaming.id, streaming.id, after.id]
    done = store.get_record(streaming.id)
    assert (done.status, done.response, done.latency_ms, done.turn) == ("ok", OK_REPLY, 42.0, 1)
    assert store.find_by_idempotency_key("support", "key-batched") == streaming.id
    assert [r.turn for r in store.get_session("support", "s")] == [0, 1, 2]


def test_writing_the_outcome_again_is_harmless(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    streaming = make_draft(status="pending", response=None)
    store.write_records([streaming])
    outcome = dataclasses.replace(streaming, status="error", error="upstream_truncated: x")
    finish = dataclasses.replace(outcome, finishes_pending=True)
    store.write_records([finish])
    store.write_records([finish])  # a batch retried after a lost commit reply
    [only] = store.get_session("support", streaming.session_id)
    assert (only.id, only.status, only.error) == (streaming.id, "error", "upstream_truncated: x")


def test_an_outcome_whose_pending_row_was_lost_is_inserted(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    store.write_records([make_draft(session_id="s")])
    # In async durability the pending row's batch may have failed for good.
    orphan = make_draft(session_id="s", finishes_pending=True)
    assert store.write_records([orphan]) == [orphan.id]
    record = store.get_record(orphan.id)
    assert (record.status, record.turn) == ("ok", 1)


def test_an_outcome_under_a_key_stored_first_elsewhere_names_that_record(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    winner = make_draft(idempotency_key="k")
    streaming = make_draft(status="pending", response=None)
    store.write_records([winner, streaming])
    finish = dataclasses.replace(streaming, status="ok", idempotency_key="k", finishes_pending=True)
    assert store.write_records([finish]) == [winner.id]
    assert store.get_record(streaming.id).status == "pending"  # the caller retries keyless
    store.write_records([dataclasses.replace(finish, idempotency_key=None)])
    assert store.get_record(streaming.id).status == "ok"


def test_settling_marks_only_pending_rows_created_before(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    now = datetime.now(UTC)
    old = make_draft(status="pending", response=None, created_at=now - timedelta(minutes=5))
    young = make_draft(status="pending", response=None, created_at=now + timedelta(minutes=5))
    finished = make_draft(created_at=now - timedelta(minutes=5))
    store.write_records([old, young, finished])

    assert store.settle_pending(now) == 1
    settled = store.get_record(old.id)
    assert (settled.status, settled.error) == ("aborted", PENDING_SETTLED)
    assert store.get_record(young.id).status == "pending"
    assert store.get_record(finished.id).status == "ok"
    assert store.settle_pending(now) == 0

    # A stream that was still running on another gateway writes its real end over it.
    store.write_records([dataclasses.replace(old, status="ok", finishes_pending=True)])
    assert store.get_record(old.id).status == "ok"

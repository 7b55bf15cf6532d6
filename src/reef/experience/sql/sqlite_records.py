"""The SQLite write path for records: plain ``sqlite3`` under one ``BEGIN IMMEDIATE``.

``write_records`` is the gateway's durability path: in ``sync`` durability every
response waits for it. Through SQLAlchemy Core a one-record batch cost ~1 ms of CPU on
the reference machine (statement building, cache keys, result objects); the same work
in plain ``sqlite3`` with statements prepared once is several times cheaper, and
``sqlite3`` releases the GIL while SQLite runs. PostgreSQL keeps the Core path.
The rows are bound exactly as SQLAlchemy binds them (same column types and processors),
so reads through SQLAlchemy see no difference.

The writer keeps connections of its own (tuned by the engine's connect hook, then
detached from the pool) instead of checking one out of the pool and resetting it for
every batch: less Python per batch on a thread that shares the GIL with the event loop.
One waits for other writers' locks as the pool's do; the other never waits, for
``write_records_now``: a caller on an event loop may write on it only when that cannot
block the loop behind another process's transaction. Neither checkpoints the WAL: a
``WalCheckpointer`` thread does, off the event loop (``reef.experience.sql.wal``).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Engine

from reef.db import schema as t
from reef.experience.errors import StoreUnavailableError
from reef.experience.records import RecordDraft
from reef.experience.sql.rows import OUTCOME_COLUMNS, finish_batched, kept_responses, record_row
from reef.experience.sql.wal import (
    CHECKPOINT_EVERY_RECORDS,
    CHECKPOINT_INTERVAL_SECONDS,
    LIMIT_PAGES,
    OwnConnection,
    WalCheckpointer,
)

_COLUMNS = [column.name for column in t.records.columns]
_INSERT_RECORDS = (
    f"INSERT OR IGNORE INTO records ({', '.join(_COLUMNS)}) "  # noqa: S608 (column names from the schema; values are bound)
    f"VALUES ({', '.join(':' + name for name in _COLUMNS)})"
)
_FINISH_PENDING = (
    f"UPDATE records SET {', '.join(f'{name} = :{name}' for name in OUTCOME_COLUMNS)} "  # noqa: S608 (column names from the schema; values are bound)
    "WHERE id = :id"
)
_RESPONSE_COLUMNS = [column.name for column in t.responses.columns]
_INSERT_RESPONSES = (
    f"INSERT OR IGNORE INTO responses ({', '.join(_RESPONSE_COLUMNS)}) "  # noqa: S608 (column names from the schema; values are bound)
    f"VALUES ({', '.join(':' + name for name in _RESPONSE_COLUMNS)})"
)
_INSERT_SCENARIO = (
    "INSERT OR IGNORE INTO scenarios (name, created_at, config_json) VALUES (?, ?, NULL)"
)
_MAX_TURNS = (
    "SELECT session_id, MAX(turn) FROM records WHERE scenario = ? AND session_id IN ({}) "
    "GROUP BY session_id"
)
_STORED_KEYS = (
    "SELECT idempotency_key, id FROM records WHERE scenario = ? AND idempotency_key IN ({})"
)
_IN_CHUNK = 500  # SQLite's bound-parameter limit is far above; keeps statements small


class SQLiteRecordWriter:
    """Writes record batches on SQLite; used by ``SQLExperienceStore`` only."""

    def __init__(
        self,
        engine: Engine,
        checkpoint_every_records: int = CHECKPOINT_EVERY_RECORDS,
        checkpoint_interval_seconds: float = CHECKPOINT_INTERVAL_SECONDS,
        wal_limit_pages: int = LIMIT_PAGES,
    ) -> None:
        self._engine = engine
        dialect = engine.dialect
        self._created_at: Callable[[Any], Any] = t.records.c.created_at.type.dialect_impl(
            dialect
        ).bind_processor(dialect) or (lambda value: value)
        self._response_created_at: Callable[[Any], Any] = (
            t.responses.c.created_at.type.dialect_impl(dialect).bind_processor(dialect)
            or (lambda value: value)
        )
        self._lock = threading.Lock()  # one batch at a time, on either connection
        # Both answer SQLITE_BUSY at once; a batch that may wait polls (``_begin``).
        self._waiting = OwnConnection(engine, 0)  # waits for other writers' locks
        self._now = OwnConnection(engine, 0)  # never waits
        self.checkpointer = WalCheckpointer(
            engine,
            hold=self._lock,
            every_records=checkpoint_every_records,
            interval_seconds=checkpoint_interval_seconds,
            limit_pages=wal_limit_pages,
        )

    def write(
        self, drafts: Sequence[RecordDraft], known_scenarios: set[str], wait: bool = True
    ) -> list[str] | None:
        """Insert ``drafts`` in one transaction (see ``ExperienceStore.write_records``).

        With ``wait`` false, ``None`` (nothing written) instead of waiting for a batch
        of another thread or for another connection's write lock
        (``ExperienceStore.write_records_now``).
        """
        now = datetime.now(UTC)
        if not self._lock.acquire(blocking=wait):
            return None
        own = self._waiting if wait else self._now
        try:
            connection = own.get()
            cursor = connection.cursor()
            try:
                _begin(cursor, own.engine_busy_timeout_ms / 1000 if wait else NOW_WAIT_SECONDS)
                ids = self._write(cursor, drafts, known_scenarios, now)
                cursor.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    cursor.execute("ROLLBACK")
                raise
            finally:
                cursor.close()
        except sqlite3.OperationalError as error:  # locked, disk full, file gone, ...
            if not wait and error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY:
                return None  # rolled back: the caller queues the drafts instead
            own.close()  # whatever state it is in, the next batch starts afresh
            raise StoreUnavailableError(f"experience store unavailable: {error}") from error
        else:
            self.checkpointer.committed(len(drafts))  # under the lock, as close() is
        finally:
            self._lock.release()
        return ids

    def close(self) -> None:
        """Stop the checkpointer and close the writer's connections (the next ``write``
        opens others and starts it again)."""
        with self._lock:
            stopped = self.checkpointer.stop()
            self._waiting.close()
            self._now.close()
        self.checkpointer.join(stopped)  # outside the lock, which a restart takes

    def _write(
        self,
        cursor: sqlite3.Cursor,
        drafts: Sequence[RecordDraft],
        known_scenarios: set[str],
        now: datetime,
    ) -> list[str]:
        created = self._created_at(now)
        for name in sorted({d.scenario for d in drafts} - known_scenarios):
            cursor.execute(_INSERT_SCENARIO, (name, created))
        stored = _stored_keys(cursor, drafts)
        next_turn = _next_turns(cursor, drafts)
        ids: list[str] = []
        rows: list[dict[str, Any]] = []
        batched: dict[str, dict[str, Any]] = {}  # id -> its row, not inserted yet
        for draft in drafts:
            key = (draft.scenario, draft.idempotency_key)
            if draft.idempotency_key is not None:
                if key in stored:
                    ids.append(stored[key])
                    continue
                stored[key] = draft.id  # a later draft of this batch dedupes on it
            ids.append(draft.id)
            if draft.finishes_pending and (
                finish_batched(batched, draft, now) or _finish_pending(cursor, draft, now)
            ):
                continue
            session = (draft.scenario, draft.session_id)
            if draft.finishes_pending and session not in next_turn:
                # Its pending row was never written (a failed async batch): insert it
                # whole, in the turn it would have had.
                next_turn.update(
                    _next_turns(cursor, [dataclasses.replace(draft, finishes_pending=False)])
                )
            row = record_row(draft, next_turn[session], now)
            row["created_at"] = self._created_at(row["created_at"])
            rows.append(row)
            batched[draft.id] = row
            next_turn[session] += 1
        if rows:
            cursor.executemany(_INSERT_RECORDS, rows)
        kept = kept_responses(drafts, ids, now)
        for row in kept:
            row["created_at"] = self._response_created_at(row["created_at"])
        if kept:
            cursor.executemany(_INSERT_RESPONSES, kept)
        return ids


POLL_FIRST_SECONDS = 0.0001
POLL_MAX_SECONDS = 0.002
"""How a batch waits for another process's write lock (``reef serve --workers N``:
every gateway process writes its own records): it asks again after 0.1 ms, doubling
up to 2 ms, until the engine's busy timeout has passed. SQLite's own busy handler
sleeps 1, 2, 5, 10, 15, 20, 25 ms... between tries, so under two writers committing
every fraction of a millisecond a batch that lost the race once kept sleeping past
many free moments: with two workers at concurrency 32, Reef's p99 was 40.5 ms against
the passthrough's 16.2 (docs/benchmarks.md, "Flat tail and gateway workers")."""


NOW_WAIT_SECONDS = 0.001
"""How long a batch written on the event loop (``write_records_now``) polls for another
process's write lock before it goes to the writer thread instead. Another gateway
process holds the lock for a commit of ~0.1-0.2 ms; the hand-off to the writer thread
and back costs the response a thread switch each way (Python switches the GIL every 5
ms). With two workers at concurrency 32 (the bench above), polling 1 ms took Reef's p99
from 41.2 ms to 25.9 (the passthrough's: 15.2 and 13.4); 5 ms gave 25.6."""


def _begin(cursor: sqlite3.Cursor, wait_seconds: float) -> None:
    """``BEGIN IMMEDIATE`` (the write lock, taken before anything is written, so a busy
    answer leaves nothing to undo), asked again while another connection holds the lock
    for up to ``wait_seconds`` (see :data:`POLL_MAX_SECONDS`); 0: busy at once."""
    delay, deadline = POLL_FIRST_SECONDS, None
    while True:
        try:
            cursor.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            now = time.monotonic()
            deadline = now + wait_seconds if deadline is None else deadline
            if now >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_SECONDS)


def _finish_pending(cursor: sqlite3.Cursor, draft: RecordDraft, now: datetime) -> bool:
    """Write ``draft``'s outcome over its ``pending`` row; False when there is none."""
    row = record_row(draft, 0, now)
    cursor.execute(_FINISH_PENDING, {name: row[name] for name in ("id", *OUTCOME_COLUMNS)})
    return cursor.rowcount == 1


def _grouped(
    drafts: Sequence[RecordDraft], value: Callable[[RecordDraft], str | None]
) -> dict[str, list[str]]:
    groups: dict[str, set[str]] = defaultdict(set)
    for draft in drafts:
        item = value(draft)
        if item is not None:
            groups[draft.scenario].add(item)
    return {scenario: sorted(items) for scenario, items in groups.items()}


def _stored_keys(
    cursor: sqlite3.Cursor, drafts: Sequence[RecordDraft]
) -> dict[tuple[str, str | None], str]:
    stored: dict[tuple[str, str | None], str] = {}
    for scenario, keys in _grouped(drafts, lambda d: d.idempotency_key).items():
        for start in range(0, len(keys), _IN_CHUNK):
            chunk = keys[start : start + _IN_CHUNK]
            sql = _STORED_KEYS.format(", ".join("?" * len(chunk)))
            for key, record_id in cursor.execute(sql, (scenario, *chunk)):
                stored[(scenario, key)] = record_id
    return stored


def _next_turns(
    cursor: sqlite3.Cursor, drafts: Sequence[RecordDraft]
) -> dict[tuple[str, str], int]:
    """One more than the highest stored turn of each session. A session the gateway has
    just minted has no stored turn by construction, so it costs no query."""
    next_turn: dict[tuple[str, str], int] = defaultdict(int)
    existing = _grouped(
        drafts, lambda d: None if d.session_is_new or d.finishes_pending else d.session_id
    )
    for scenario, sessions in existing.items():
        for start in range(0, len(sessions), _IN_CHUNK):
            chunk = sessions[start : start + _IN_CHUNK]
            sql = _MAX_TURNS.format(", ".join("?" * len(chunk)))
            for session_id, max_turn in cursor.execute(sql, (scenario, *chunk)):
                if max_turn is not None:
                    next_turn[(scenario, session_id)] = max_turn + 1
    return next_turn

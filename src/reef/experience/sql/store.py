"""``SQLExperienceStore``: the experience store on SQLite or PostgreSQL (SQLAlchemy Core).

Concurrency: every write runs in one transaction that first takes the locks it needs —
SQLite's write lock (``BEGIN IMMEDIATE``), or on PostgreSQL transaction-level advisory
locks on the sessions and idempotency keys it touches — so turn numbers and idempotency
checks stay correct when several gateways share one database.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, delete, func, insert, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.sql.elements import ColumnElement

from reef.core import new_id
from reef.core.errors import InvalidInputError
from reef.db import (
    DEFAULT_BUSY_TIMEOUT_MS,
    Database,
    lock_key,
    open_database,
    unavailable_on_failure,
)
from reef.db import schema as t
from reef.experience.errors import (
    FeedbackNotFoundError,
    FeedbackNotQuarantinedError,
    IdempotencyConflictError,
    RecordNotFoundError,
    SessionNotFoundError,
    StoreUnavailableError,
)
from reef.experience.records import (
    FeedbackDraft,
    FeedbackView,
    RecordDraft,
    RecordFilter,
    RecordPage,
    RecordView,
    ReleaseTraffic,
    SessionMatch,
    check_feedback_source,
)
from reef.experience.sql.curve import release_traffic
from reef.experience.sql.queries import (
    FIND_BY_KEY,
    MAX_CONTINUATION_HASHES,
    PG_MAX_TURNS,
    feedback_for,
    filter_clauses,
    find_session_statement,
)
from reef.experience.sql.rows import (
    OUTCOME_COLUMNS,
    PENDING_SETTLED,
    decode_cursor,
    encode_cursor,
    feedback_body_hash,
    feedback_view,
    finish_batched,
    json_text,
    kept_responses,
    optional_json_text,
    record_row,
    record_view,
    validated_score,
)
from reef.experience.sql.sqlite_records import SQLiteRecordWriter
from reef.experience.store import ExperienceStore

EXPORT_BATCH = 500
MAX_PAGE = 1000

_PROBE_BYTES = 64 * 1024  # what probe_write writes (and deletes)


class SQLExperienceStore(ExperienceStore):
    """The experience store on a ``Database`` (SQLite or PostgreSQL).

    The composition root that built ``database`` closes it; ``from_url`` opens one the
    store owns. Call ``migrate()`` (or ``Database.migrate``) before first use.
    """

    def __init__(self, database: Database) -> None:
        self.database = database
        self.dialect = database.dialect
        dialect_insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        # DO NOTHING on the primary key makes a retried batch (commit succeeded, reply
        # lost) harmless instead of failing forever on duplicate ids.
        self._insert_records = dialect_insert(t.records).on_conflict_do_nothing()
        self._insert_responses = dialect_insert(t.responses).on_conflict_do_nothing()
        self._insert_scenarios = dialect_insert(t.scenarios).on_conflict_do_nothing()
        self._known_scenarios: set[str] = set()
        self._scenarios_lock = threading.Lock()
        self._sqlite_records = (
            SQLiteRecordWriter(database.engine) if self.dialect == "sqlite" else None
        )
        self._owns_database = False

    @classmethod
    def from_url(
        cls, url: str, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS, migrate: bool = False
    ) -> SQLExperienceStore:
        """A store on its own ``Database`` for ``sqlite:///path`` or ``postgresql://…``
        (migrated only when ``migrate`` says so), closed with the store. Raises
        ``InvalidInputError`` for other URLs."""
        store = cls(open_database(url, migrate, busy_timeout_ms))
        store._owns_database = True
        return store

    # -- lifecycle ---------------------------------------------------------------------

    def migrate(self) -> None:
        self.database.migrate()

    def close(self) -> None:
        if self._sqlite_records is not None:
            self._sqlite_records.close()
        if self._owns_database:
            self.database.close()

    def ping(self) -> None:
        with self._write() as conn:
            if self.dialect == "postgresql":
                read_only = conn.scalar(text("SELECT current_setting('transaction_read_only')"))
                if read_only == "on":
                    raise StoreUnavailableError("experience store is read-only")
            # On SQLite, _write() already holds the write lock: the store is writable.

    def probe_write(self) -> None:
        # A scratch scenario with 64 KiB of random config needs fresh pages (SQLite's overflow
        # pages, PostgreSQL's TOAST); deleted in the same transaction, so nothing stays
        # and no reader ever sees it, yet the commit still has to write them.
        name = f"reef-write-probe-{new_id()}"
        scenarios = t.scenarios
        with self._write() as conn:
            conn.execute(
                insert(scenarios).values(
                    name=name,
                    created_at=datetime.now(UTC),
                    config_json=secrets.token_hex(_PROBE_BYTES // 2),
                )
            )
            conn.execute(delete(scenarios).where(scenarios.c.name == name))

    def _read(self) -> AbstractContextManager[Connection]:
        return self.database.read()

    def _write(self, lock_keys: Iterable[int] = ()) -> AbstractContextManager[Connection]:
        return self.database.write(lock_keys)

    # -- records -----------------------------------------------------------------------

    def write_records(self, drafts: Sequence[RecordDraft]) -> list[str]:
        if not drafts:
            return []
        if self._sqlite_records is not None:
            written = self._write_sqlite_records(drafts, wait=True)
            assert written is not None  # a write that may wait always writes
            return written
        now = datetime.now(UTC)
        lock_keys = [lock_key("session", d.scenario, d.session_id) for d in drafts]
        lock_keys += [
            lock_key("record-key", d.scenario, d.idempotency_key)
            for d in drafts
            if d.idempotency_key is not None
        ]
        scenario_names = {d.scenario for d in drafts}
        with self._write(lock_keys) as conn:
            self._ensure_scenarios(conn, scenario_names, now)
            stored = self._stored_keys(conn, drafts)
            next_turn = self._next_turns(conn, drafts)
            ids: list[str] = []
            rows: list[dict[str, Any]] = []
            batched: dict[str, dict[str, Any]] = {}  # id -> its row, not inserted yet
            for draft in drafts:
                key = (draft.scenario, draft.idempotency_key)
                if draft.idempotency_key is not None and key in stored:
                    ids.append(stored[key])
                    continue
                if draft.idempotency_key is not None:
                    stored[key] = draft.id  # a later draft in this batch dedupes on it
                ids.append(draft.id)
                if draft.finishes_pending and (
                    finish_batched(batched, draft, now) or self._finish_pending(conn, draft, now)
                ):
                    continue
                session = (draft.scenario, draft.session_id)
                if draft.finishes_pending and session not in next_turn:
                    # Its pending row was never written (a failed async batch): insert
                    # it whole, in the turn it would have had.
                    unfinished = dataclasses.replace(draft, finishes_pending=False)
                    next_turn.update(self._next_turns(conn, [unfinished]))
                rows.append(record_row(draft, next_turn[session], now))
                batched[draft.id] = rows[-1]
                next_turn[session] += 1
            if rows:
                conn.execute(self._insert_records, rows)
            kept = kept_responses(drafts, ids, now)
            if kept:
                conn.execute(self._insert_responses, kept)
        with self._scenarios_lock:
            self._known_scenarios |= scenario_names
        return ids

    def write_records_now(self, drafts: Sequence[RecordDraft]) -> list[str] | None:
        # PostgreSQL is a network round trip away: never without waiting.
        if not drafts or self._sqlite_records is None:
            return None
        return self._write_sqlite_records(drafts, wait=False)

    def _write_sqlite_records(self, drafts: Sequence[RecordDraft], wait: bool) -> list[str] | None:
        assert self._sqlite_records is not None
        with self._scenarios_lock:
            known = set(self._known_scenarios)
        with unavailable_on_failure():  # the pool's errors; sqlite3's are mapped inside
            written = self._sqlite_records.write(drafts, known, wait)
        if written is not None:
            with self._scenarios_lock:
                self._known_scenarios |= {d.scenario for d in drafts}
        return written

    def _ensure_scenarios(self, conn: Connection, names: set[str], now: datetime) -> None:
        with self._scenarios_lock:
            new = sorted(names - self._known_scenarios)
        if new:
            conn.execute(
                self._insert_scenarios,
                [{"name": name, "created_at": now, "config_json": None} for name in new],
            )

    def _stored_keys(
        self, conn: Connection, drafts: Sequence[RecordDraft]
    ) -> dict[tuple[str, str | None], str]:
        keys_by_scenario: dict[str, set[str]] = defaultdict(set)
        for draft in drafts:
            if draft.idempotency_key is not None:
                keys_by_scenario[draft.scenario].add(draft.idempotency_key)
        stored: dict[tuple[str, str | None], str] = {}
        for scenario, keys in keys_by_scenario.items():
            found = conn.execute(
                select(t.records.c.idempotency_key, t.records.c.id).where(
                    t.records.c.scenario == scenario, t.records.c.idempotency_key.in_(keys)
                )
            )
            for key, record_id in found:
                stored[(scenario, key)] = record_id
        return stored

    def _finish_pending(self, conn: Connection, draft: RecordDraft, now: datetime) -> bool:
        """Write ``draft``'s outcome over its ``pending`` row; False when there is none."""
        row = record_row(draft, 0, now)
        outcome = {name: row[name] for name in OUTCOME_COLUMNS}
        done = conn.execute(update(t.records).where(t.records.c.id == draft.id).values(**outcome))
        return done.rowcount == 1

    def release_traffic(
        self, scenario: str, release_ids: Collection[str]
    ) -> dict[str, ReleaseTraffic]:
        return release_traffic(self.database, scenario, release_ids)

    def settle_pending(self, before: datetime) -> int:
        with self._write() as conn:
            done = conn.execute(
                update(t.records)
                .where(t.records.c.status == "pending", t.records.c.created_at < before)
                .values(status="aborted", error=PENDING_SETTLED)
            )
        return int(done.rowcount)

    def _next_turns(
        self, conn: Connection, drafts: Sequence[RecordDraft]
    ) -> dict[tuple[str, str], int]:
        sessions_by_scenario: dict[str, set[str]] = defaultdict(set)
        for draft in drafts:
            if (
                not draft.session_is_new and not draft.finishes_pending
            ):  # a freshly minted session has no stored turn
                sessions_by_scenario[draft.scenario].add(draft.session_id)
        next_turn: dict[tuple[str, str], int] = defaultdict(int)
        for scenario, sessions in sessions_by_scenario.items():
            if self.dialect == "postgresql":
                # One index probe per session whatever the planner's statistics say; the
                # IN/GROUP BY form degrades to scans while a fresh table is unanalysed.
                found = conn.execute(
                    PG_MAX_TURNS, {"scenario": scenario, "sessions": sorted(sessions)}
                )
            else:
                found = conn.execute(
                    select(t.records.c.session_id, func.max(t.records.c.turn))
                    .where(t.records.c.scenario == scenario, t.records.c.session_id.in_(sessions))
                    .group_by(t.records.c.session_id)
                )
            for session_id, max_turn in found:
                if max_turn is not None:
                    next_turn[(scenario, session_id)] = max_turn + 1
        return next_turn

    def find_session(
        self, scenario: str, continuation_hashes: Sequence[str]
    ) -> SessionMatch | None:
        hashes = list(dict.fromkeys(continuation_hashes))[:MAX_CONTINUATION_HASHES]
        if not hashes:
            return None
        params: dict[str, str] = {"scenario": scenario}
        params.update((f"h{position}", value) for position, value in enumerate(hashes))
        with self._read() as conn:
            row = conn.execute(find_session_statement(len(hashes)), params).mappings().first()
        if row is None:
            return None
        return SessionMatch(session_id=row["session_id"], record_id=row["id"], turn=row["turn"])

    def find_by_idempotency_key(self, scenario: str, key: str) -> str | None:
        with self._read() as conn:
            found: str | None = conn.scalar(FIND_BY_KEY, {"scenario": scenario, "key": key})
        return found

    def find_by_idempotency_keys(self, scenario: str, keys: Sequence[str]) -> dict[str, str]:
        r = t.records.c
        found: dict[str, str] = {}
        with self._read() as conn:
            for chunk in _chunks(list(dict.fromkeys(keys))):
                query = select(r.idempotency_key, r.id).where(
                    r.scenario == scenario, r.idempotency_key.in_(chunk)
                )
                found.update((key, record_id) for key, record_id in conn.execute(query))
        return found

    # -- feedback ----------------------------------------------------------------------

    def add_feedback(self, draft: FeedbackDraft) -> tuple[str, bool]:
        return self.add_feedback_many([draft])[0]

    def add_feedback_many(self, drafts: Sequence[FeedbackDraft]) -> list[tuple[str, bool]]:
        prepared = [self._feedback_row(draft) for draft in drafts]
        lock_keys = [
            lock_key("feedback-key", d.scenario, d.idempotency_key)
            for d in drafts
            if d.idempotency_key is not None
        ]
        with self._write(lock_keys) as conn:
            return self._insert_feedback_many(conn, drafts, prepared)

    def _feedback_row(self, draft: FeedbackDraft) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The ``feedback`` row of ``draft`` and the records it names (checked: see
        ``add_feedback``)."""
        score = validated_score(draft.score)
        check_feedback_source(draft.source, draft.confidence)
        record_ids = tuple(dict.fromkeys(draft.record_ids))
        if not record_ids and draft.session_id is None:
            raise InvalidInputError("feedback needs at least one record id or a session id")
        if draft.session_id is not None and len(record_ids) > 1:
            raise InvalidInputError(
                "record_ids: feedback on a session targets at most one of its turns, "
                f"got {len(record_ids)} record ids"
            )
        row: dict[str, Any] = {
            "id": new_id(),
            "scenario": draft.scenario,
            "score": score,
            "feedback_json": optional_json_text(draft.feedback, "feedback"),
            "correction_json": optional_json_text(draft.correction, "correction"),
            "metadata_json": json_text(draft.metadata or {}, "metadata"),
            "principal": draft.principal,
            "trust": draft.trust,
            "session_id": draft.session_id,
            "source": draft.source,
            "confidence": draft.confidence,
            "idempotency_key": draft.idempotency_key,
            "body_hash": feedback_body_hash(draft, score),
            "created_at": datetime.now(UTC),
        }
        return row, record_ids

    def _insert_feedback_many(
        self,
        conn: Connection,
        drafts: Sequence[FeedbackDraft],
        prepared: Sequence[tuple[dict[str, Any], tuple[str, ...]]],
    ) -> list[tuple[str, bool]]:
        """Insert ``drafts`` with one lookup per kind (keys, records, sessions) and one
        multi-row insert per table; checks and errors as ``add_feedback`` per draft, in
        order (an earlier draft's key counts for a later one). One round trip per kind,
        not per draft: ``bench/import_export.py`` (feedback was 70% of an import's time)."""
        earlier = self._stored_feedback_keys(conn, drafts)
        records = self._records_of(conn, drafts, prepared)
        sessions = self._sessions_of(conn, drafts)
        results: list[tuple[str, bool]] = []
        rows: list[dict[str, Any]] = []
        refs: list[dict[str, Any]] = []
        for draft, (row, record_ids) in zip(drafts, prepared, strict=True):
            key = (draft.scenario, draft.idempotency_key)
            if draft.idempotency_key is not None:
                found = earlier.get(key)
                if found is not None:
                    if found[1] != row["body_hash"]:
                        raise IdempotencyConflictError(draft.scenario, draft.idempotency_key)
                    results.append((found[0], False))
                    continue
            if draft.session_id is not None and (draft.scenario, draft.session_id) not in sessions:
                raise SessionNotFoundError(draft.scenario, draft.session_id)
            _check_records(records, draft.scenario, record_ids, draft.session_id)
            if draft.idempotency_key is not None:
                earlier[key] = (row["id"], row["body_hash"])
            rows.append(row)
            refs.extend(
                {"feedback_id": row["id"], "record_id": record_id, "position": position}
                for position, record_id in enumerate(record_ids)
            )
            results.append((row["id"], True))
        if rows:
            conn.execute(t.feedback.insert(), rows)
        if refs:
            conn.execute(t.feedback_refs.insert(), refs)
        return results

    def _stored_feedback_keys(
        self, conn: Connection, drafts: Sequence[FeedbackDraft]
    ) -> dict[tuple[str, str | None], tuple[str, str]]:
        """(scenario, idempotency key) -> (id, body hash) of the stored feedback."""
        fb = t.feedback.c
        found: dict[tuple[str, str | None], tuple[str, str]] = {}
        for scenario, keys in _by_scenario(
            (d.scenario, d.idempotency_key) for d in drafts if d.idempotency_key is not None
        ).items():
            for chunk in _chunks(keys):
                query = select(fb.idempotency_key, fb.id, fb.body_hash).where(
                    fb.scenario == scenario, fb.idempotency_key.in_(chunk)
                )
                for key, feedback_id, body_hash in conn.execute(query):
                    found[(scenario, key)] = (feedback_id, body_hash)
        return found

    def _records_of(
        self,
        conn: Connection,
        drafts: Sequence[FeedbackDraft],
        prepared: Sequence[tuple[dict[str, Any], tuple[str, ...]]],
    ) -> dict[tuple[str, str], str]:
        """(scenario, record id) -> session id of the records the drafts name."""
        r = t.records.c
        found: dict[tuple[str, str], str] = {}
        wanted = _by_scenario(
            (draft.scenario, record_id)
            for draft, (_, record_ids) in zip(drafts, prepared, strict=True)
            for record_id in record_ids
        )
        for scenario, ids in wanted.items():
            for chunk in _chunks(ids):
                # By primary key alone: with ``scenario = ?`` in the query SQLite walks the
                # scenario's index instead, a scan of every record per batch.
                query = select(r.id, r.scenario, r.session_id).where(r.id.in_(chunk))
                for record_id, stored_in, session in conn.execute(query):
                    if stored_in == scenario:
                        found[(scenario, record_id)] = session
        return found

    def _sessions_of(
        self, conn: Connection, drafts: Sequence[FeedbackDraft]
    ) -> set[tuple[str, str]]:
        """The (scenario, session id) of the drafts' sessions that have a record."""
        r = t.records.c
        found: set[tuple[str, str]] = set()
        wanted = _by_scenario(
            (d.scenario, d.session_id) for d in drafts if d.session_id is not None
        )
        for scenario, sessions in wanted.items():
            for chunk in _chunks(sessions):
                query = (
                    select(r.session_id)
                    .where(r.scenario == scenario, r.session_id.in_(chunk))
                    .distinct()
                )
                found.update((scenario, session) for session in conn.scalars(query))
        return found

    def session_feedback(self, scenario: str, session_id: str | None = None) -> list[FeedbackView]:
        fb = t.feedback.c
        clauses = [fb.scenario == scenario, fb.session_id.is_not(None)]
        if session_id is not None:
            clauses.append(fb.session_id == session_id)
        with self._read() as conn:
            views = self._feedback_views(conn, *clauses, limit=None)
        return sorted(views, key=lambda view: (view.created_at, view.id))

    def get_feedback(self, feedback_id: str) -> FeedbackView:
        with self._read() as conn:
            found = self._feedback_views(conn, t.feedback.c.id == feedback_id, limit=1)
        if not found:
            raise FeedbackNotFoundError(feedback_id)
        return found[0]

    def new_feedback_count(self, scenario: str, since: datetime | None) -> int:
        fb = t.feedback.c
        statement = select(func.count()).select_from(t.feedback).where(fb.scenario == scenario)
        if since is not None:
            statement = statement.where(fb.created_at > since)
        with self._read() as conn:
            return int(conn.scalar(statement) or 0)

    def list_feedback(
        self,
        scenario: str,
        quarantined: bool | None = None,
        before: str | None = None,
        limit: int = 100,
    ) -> list[FeedbackView]:
        fb = t.feedback.c
        held = fb.quarantined_at.is_not(None) & fb.released_at.is_(None)
        clauses: list[ColumnElement[bool]] = [fb.scenario == scenario]
        if quarantined is not None:
            clauses.append(held if quarantined else ~held)
        if before is not None:
            clauses.append(fb.id < before)
        with self._read() as conn:
            return self._feedback_views(conn, *clauses, limit=max(1, min(limit, MAX_PAGE)))

    def _feedback_views(
        self, conn: Connection, *clauses: ColumnElement[bool], limit: int | None
    ) -> list[FeedbackView]:
        found = conn.execute(
            select(t.feedback).where(*clauses).order_by(t.feedback.c.id.desc())
        ).mappings()
        rows = found.all() if limit is None else found.fetchmany(limit)
        targets: dict[str, list[str]] = defaultdict(list)
        if rows:
            refs = t.feedback_refs.c
            for feedback_id, record_id in conn.execute(
                select(refs.feedback_id, refs.record_id)
                .where(refs.feedback_id.in_([row["id"] for row in rows]))
                .order_by(refs.feedback_id, refs.position)
            ):
                targets[feedback_id].append(record_id)
        return [feedback_view(row, tuple(targets[row["id"]])) for row in rows]

    def quarantine_feedback(self, reasons: Mapping[str, str]) -> int:
        if not reasons:
            return 0
        fb = t.feedback.c
        now = datetime.now(UTC)
        held = 0
        with self._write() as conn:
            for feedback_id, reason in sorted(reasons.items()):
                held += conn.execute(
                    t.feedback.update()
                    .where(
                        fb.id == feedback_id,
                        fb.quarantined_at.is_(None),
                        fb.released_at.is_(None),
                    )
                    .values(quarantine_reason=reason, quarantined_at=now)
                ).rowcount
        return held

    def release_feedback(self, feedback_id: str, actor: str | None) -> FeedbackView:
        fb = t.feedback.c
        with self._write() as conn:
            changed = conn.execute(
                t.feedback.update()
                .where(fb.id == feedback_id, fb.quarantined_at.is_not(None))
                .where(fb.released_at.is_(None))
                .values(released_at=datetime.now(UTC), released_by=actor)
            ).rowcount
        if changed == 0:
            self.get_feedback(feedback_id)  # raises FeedbackNotFoundError
            raise FeedbackNotQuarantinedError(feedback_id)
        return self.get_feedback(feedback_id)

    # -- reads -------------------------------------------------------------------------

    def _views(self, conn: Connection, rows: Sequence[RowMapping]) -> list[RecordView]:
        feedback = feedback_for(conn, [row["id"] for row in rows])
        return [record_view(row, feedback.get(row["id"], ())) for row in rows]

    def get_record(self, record_id: str) -> RecordView:
        with self._read() as conn:
            row = (
                conn.execute(select(t.records).where(t.records.c.id == record_id))
                .mappings()
                .first()
            )
            if row is None:
                raise RecordNotFoundError(record_id)
            return self._views(conn, [row])[0]

    def list_records(
        self, scenario: str, filters: RecordFilter, cursor: str | None, limit: int
    ) -> RecordPage:
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInputError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        r = t.records.c
        statement = select(t.records).where(r.scenario == scenario, *filter_clauses(filters))
        if cursor is not None:
            created_at, record_id = decode_cursor(cursor)
            # The first conjunct is an index range; the second breaks ties on id.
            statement = statement.where(
                r.created_at <= created_at, or_(r.created_at < created_at, r.id < record_id)
            )
        statement = statement.order_by(r.created_at.desc(), r.id.desc()).limit(limit + 1)
        with self._read() as conn:
            rows = conn.execute(statement).mappings().all()
            views = self._views(conn, rows[:limit])
        next_cursor = None
        if len(rows) > limit:
            last = views[-1]
            next_cursor = encode_cursor(last.created_at, last.id)
        return RecordPage(records=tuple(views), next_cursor=next_cursor)

    def get_session(self, scenario: str, session_id: str) -> list[RecordView]:
        r = t.records.c
        with self._read() as conn:
            rows = (
                conn.execute(
                    select(t.records)
                    .where(r.scenario == scenario, r.session_id == session_id)
                    .order_by(r.turn, r.created_at, r.id)
                )
                .mappings()
                .all()
            )
            if not rows:
                raise SessionNotFoundError(scenario, session_id)
            return self._views(conn, rows)

    def iter_export(self, scenario: str, since: str | None = None) -> Iterator[RecordView]:
        """Every record of the scenario, oldest first, with feedback, streamed.

        ``since`` is an ISO-8601 timestamp (records created at or after it) or a record
        id (records strictly after it, for incremental exports). Batches are read with
        keyset pagination, each in its own short transaction, so a long export never
        pins an old snapshot.
        """
        r = t.records.c
        lower: tuple[datetime, str] | None = None
        base = select(t.records).where(r.scenario == scenario)
        if since is not None:
            lower, base = self._export_start(scenario, since, base)
        while True:
            statement = base
            if lower is not None:
                statement = statement.where(
                    r.created_at >= lower[0], or_(r.created_at > lower[0], r.id > lower[1])
                )
            statement = statement.order_by(r.created_at, r.id).limit(EXPORT_BATCH)
            with self._read() as conn:
                rows = conn.execute(statement).mappings().all()
                views = self._views(conn, rows)
            yield from views
            if len(rows) < EXPORT_BATCH:
                return
            lower = (views[-1].created_at, views[-1].id)

    def _export_start(
        self, scenario: str, since: str, base: Select[Any]
    ) -> tuple[tuple[datetime, str] | None, Select[Any]]:
        try:
            when = datetime.fromisoformat(since)
        except ValueError:
            with self._read() as conn:
                anchor = conn.execute(
                    select(t.records.c.created_at).where(
                        t.records.c.id == since, t.records.c.scenario == scenario
                    )
                ).first()
            if anchor is None:
                raise RecordNotFoundError(since, scenario) from None
            return (anchor.created_at, since), base
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return None, base.where(t.records.c.created_at >= when)

    # -- releases ----------------------------------------------------------------------


_IN_CHUNK = 500  # values per IN list, well under SQLite's bound-parameter limit


def _by_scenario(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(scenario, value) pairs as scenario -> distinct values, in first-seen order."""
    grouped: dict[str, dict[str, None]] = defaultdict(dict)
    for scenario, value in pairs:
        grouped[scenario][value] = None
    return {scenario: list(values) for scenario, values in grouped.items()}


def _chunks(values: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(values), _IN_CHUNK):
        yield values[start : start + _IN_CHUNK]


def _check_records(
    records: dict[tuple[str, str], str],
    scenario: str,
    record_ids: Sequence[str],
    session_id: str | None,
) -> None:
    """Raise as ``add_feedback`` does for a record id not in ``scenario`` or, with a
    ``session_id``, not a turn of that session (``records``: ``_records_of``)."""
    for record_id in record_ids:
        session = records.get((scenario, record_id))
        if session is None:
            raise RecordNotFoundError(record_id, scenario)
        if session_id is not None and session != session_id:
            raise InvalidInputError(
                f"record_ids: record {record_id!r} is not a turn of session {session_id!r}"
            )

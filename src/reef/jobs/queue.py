"""``JobQueue``: learning jobs in the ``jobs`` table, claimed with leases.

A job is ``queued`` until a worker claims it (``running``, with ``lease_owner`` and
``lease_until``); the worker heartbeats to keep the lease, then completes it
(``succeeded``) or fails it (back to ``queued`` for a retry, or ``failed``). A worker that
dies stops heartbeating: once its lease expires another worker claims the job again, with
``attempt`` one higher. ``cancel`` ends a queued or running job; the running worker learns
of it at its next heartbeat (``JobCancelledError``).

Never two learning jobs of one scenario at once: ``enqueue`` returns the scenario's queued
or running job instead of adding a second, and ``claim`` skips a job whose scenario has a
running job with a live lease.

Time: a lease is measured by the queue's ``clock`` (``claim`` and ``heartbeat`` set
``lease_until`` from it, ``claim`` compares ``lease_until`` with it; default: the wall
clock in UTC), so a test moves a clock past a lease instead of sleeping. Rows'
``created_at`` and ``updated_at`` are stamped with the wall clock, like every other
table's, because selection and the feedback trigger compare a job's ``created_at`` with
records' and feedback's. Timestamps are bound as parameters (``UTCDateTime`` stores
them in UTC on both backends), never the database's own ``now()``.

Concurrency: on SQLite every write is one ``BEGIN IMMEDIATE`` transaction (writers run
one at a time). On PostgreSQL ``claim`` picks its row with ``FOR UPDATE SKIP LOCKED`` (two
claimers never wait on, or get, the same row) and both ``enqueue`` and ``claim`` take a
transaction-level advisory lock on the scenario before checking for its active job.

The ``jobs`` table is defined with the others (``reef.db.schema``, one database
and one migration chain); the queue is its own part because both the gateway (which
enqueues manual jobs) and ``learning`` (whose workers claim them) use it, and the
gateway must never import ``learning``.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

from sqlalchemy import and_, exists, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, RowMapping

from reef.core import Clock, dumps, loads, new_id, read_clock, utc_now
from reef.core.errors import ConflictError, InvalidInputError, NotFoundError, RefusedError
from reef.db import Database, lock_key
from reef.db import schema as t

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
ACTIVE_STATES: tuple[JobState, ...] = ("queued", "running")

DEFAULT_MAX_ATTEMPTS = 3
MAX_LOG_LINES = 200
MAX_PAGE = 1000


class JobNotFoundError(NotFoundError):
    """No job with this id."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} not found")
        self.job_id = job_id


class NoRecipeError(RefusedError):
    """A learning job asked for a scenario that has no recipe to learn with: refused
    before it is queued, since a worker could only fail it."""

    def __init__(self, scenario: str, also: str = "") -> None:
        super().__init__(
            f"scenario {scenario!r} has no recipe to learn with, so no job was queued; set "
            f"scenarios.{scenario}.recipe to a recipe file (docs/recipes.md) in the "
            f"configuration{also}"
        )
        self.scenario = scenario


class LeaseLostError(ConflictError):
    """The caller no longer holds the job's lease (it expired and another worker claimed
    the job, or the job ended): it must stop working on the job and write nothing more."""

    def __init__(self, job_id: str, owner: str, why: str) -> None:
        super().__init__(f"worker {owner!r} lost the lease of job {job_id!r}: {why}")
        self.job_id = job_id
        self.owner = owner


class JobCancelledError(LeaseLostError):
    """The job was cancelled while the caller ran it."""


@dataclass(frozen=True)
class Job:
    """One learning job as stored. ``input`` is what the job was asked (e.g. the trigger);
    ``result`` what it produced; ``metrics`` named values (lists when repeated)."""

    id: str
    scenario: str
    kind: str
    state: JobState
    lease_owner: str | None
    lease_until: datetime | None
    attempt: int
    input: dict[str, Any]
    result: dict[str, Any] | None
    progress: float | None
    message: str | None
    error: str | None
    logs: list[str]
    metrics: dict[str, Any]
    candidate_id: str | None
    created_at: datetime
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (timestamps in ISO 8601)."""
        return {
            "id": self.id,
            "scenario": self.scenario,
            "kind": self.kind,
            "state": self.state,
            "lease_owner": self.lease_owner,
            "lease_until": None if self.lease_until is None else self.lease_until.isoformat(),
            "attempt": self.attempt,
            "input": self.input,
            "result": self.result,
            "progress": self.progress,
            "message": self.message,
            "error": self.error,
            "logs": self.logs,
            "metrics": self.metrics,
            "candidate_id": self.candidate_id,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


def _json(value: Any) -> str:
    return dumps(value).decode()


def _job(row: RowMapping) -> Job:
    return Job(
        id=row["id"],
        scenario=row["scenario"],
        kind=row["kind"],
        state=row["state"],
        lease_owner=row["lease_owner"],
        lease_until=row["lease_until"],
        attempt=row["attempt"],
        input=loads(row["input_json"]) if row["input_json"] else {},
        result=loads(row["result_json"]) if row["result_json"] else None,
        progress=row["progress"],
        message=row["message"],
        error=row["error"],
        logs=loads(row["logs_json"]) if row["logs_json"] else [],
        metrics=loads(row["metrics_json"]) if row["metrics_json"] else {},
        candidate_id=row["candidate_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _scenario_key(scenario: str) -> int:
    return lock_key("job-scenario", scenario)


def _check_state(state: str | None) -> None:
    if state is not None and state not in JOB_STATES:
        raise InvalidInputError(f"job state must be one of {list(JOB_STATES)}, not {state!r}")


class JobQueue:
    """Learning jobs on the ``Database`` the composition root hands it (migrated).
    Database failures raise ``StoreUnavailableError``.

    ``max_attempts``: a job whose lease expired, or that failed with ``retry=True``, this
    many times is ``failed`` instead of being claimed again. ``clock``: what time it is
    for leases (see the module docstring); it must return timezone-aware datetimes.
    """

    def __init__(
        self, database: Database, max_attempts: int = DEFAULT_MAX_ATTEMPTS, clock: Clock = utc_now
    ) -> None:
        if max_attempts < 1:
            raise InvalidInputError("max_attempts must be at least 1")
        self.database = database
        self.dialect = database.dialect
        self.max_attempts = max_attempts
        self.clock = clock
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        self._insert_consumed = insert(t.consumed).on_conflict_do_nothing()

    def _read(self) -> AbstractContextManager[Connection]:
        return self.database.read()

    def _write(self, scenario: str | None = None) -> AbstractContextManager[Connection]:
        keys = () if scenario is None else (_scenario_key(scenario),)
        return self.database.write(keys)

    def _lock_scenario(self, conn: Connection, scenario: str) -> None:
        self.database.lock(conn, (_scenario_key(scenario),))

    # -- creating and claiming -----------------------------------------------------------

    def enqueue(
        self, scenario: str, kind: str, input: dict[str, Any], dedupe_running: bool = True
    ) -> Job:
        """Add a queued job. With ``dedupe_running`` (the default) a scenario that already
        has a queued or running job gets that job back and nothing is added."""
        now = datetime.now(UTC)
        c = t.jobs.c
        with self._write(scenario) as conn:
            if dedupe_running:
                active = (
                    conn.execute(
                        select(t.jobs)
                        .where(c.scenario == scenario, c.state.in_(ACTIVE_STATES))
                        .order_by(c.created_at, c.id)
                        .limit(1)
                    )
                    .mappings()
                    .first()
                )
                if active is not None:
                    return _job(active)
            job_id = new_id()
            row: dict[str, Any] = {
                "id": job_id,
                "scenario": scenario,
                "kind": kind,
                "state": "queued",
                "lease_owner": None,
                "lease_until": None,
                "attempt": 0,
                "input_json": _json(input),
                "result_json": None,
                "created_at": now,
                "updated_at": now,
            }
            conn.execute(t.jobs.insert(), row)
            return self._get(conn, job_id)

    def claim(self, owner: str, lease_seconds: float) -> Job | None:
        """The oldest runnable job, now ``running`` under ``owner`` until ``lease_seconds``
        from now, ``attempt`` one higher; None when nothing is runnable.

        Runnable: ``queued``, or ``running`` with an expired lease (its worker died). An
        expired job that already had ``max_attempts`` attempts is marked ``failed``
        instead. A job whose scenario has another running job with a live lease waits.
        """
        now = self.now()
        c = t.jobs.c
        other = t.jobs.alias("other")
        busy = exists().where(
            other.c.scenario == c.scenario,
            other.c.id != c.id,
            other.c.state == "running",
            other.c.lease_until >= now,
        )
        runnable = or_(c.state == "queued", and_(c.state == "running", c.lease_until < now))
        statement = select(t.jobs).where(runnable, ~busy).order_by(c.created_at, c.id).limit(1)
        if self.dialect == "postgresql":
            statement = statement.with_for_update(of=t.jobs, skip_locked=True)
        while True:
            with self._write() as conn:
                row = conn.execute(statement).mappings().first()
                if row is None:
                    return None
                self._lock_scenario(conn, row["scenario"])
                if self.dialect == "postgresql" and conn.scalar(
                    select(func.count()).where(
                        c.scenario == row["scenario"],
                        c.id != row["id"],
                        c.state == "running",
                        c.lease_until >= now,
                    )
                ):
                    return None  # a claimer of a sibling job committed first
                if row["state"] == "running" and row["attempt"] >= self.max_attempts:
                    self._set(
                        conn,
                        row["id"],
                        state="failed",
                        lease_owner=None,
                        lease_until=None,
                        error=f"lease expired on attempt {row['attempt']} of "
                        f"{self.max_attempts}; giving up",
                    )
                    continue
                self._set(
                    conn,
                    row["id"],
                    state="running",
                    lease_owner=owner,
                    lease_until=now + timedelta(seconds=lease_seconds),
                    attempt=row["attempt"] + 1,
                )
                return self._get(conn, row["id"])

    # -- the owner's writes --------------------------------------------------------------

    def heartbeat(self, job_id: str, owner: str, lease_seconds: float) -> Job:
        """Extend the lease to ``lease_seconds`` from now. Raises ``LeaseLostError``
        (``JobCancelledError`` when cancelled) unless ``owner`` still holds the job."""
        until = self.now() + timedelta(seconds=lease_seconds)
        with self._write() as conn:
            self._owned(conn, job_id, owner)
            self._set(conn, job_id, lease_until=until)
            return self._get(conn, job_id)

    def progress(
        self,
        job_id: str,
        owner: str,
        fraction: float,
        message: str,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """Store progress (clamped to [0, 1]) and ``message`` (also appended to the job's
        logs, of which the last 200 lines are kept); ``metrics`` are merged into the
        job's. Raises ``LeaseLostError`` unless ``owner`` holds the job."""
        with self._write() as conn:
            job = self._owned(conn, job_id, owner)
            values: dict[str, Any] = {
                "progress": min(max(float(fraction), 0.0), 1.0),
                "message": message,
                "logs_json": _json([*job.logs, message][-MAX_LOG_LINES:]),
            }
            if metrics:
                values["metrics_json"] = _json({**job.metrics, **metrics})
            self._set(conn, job_id, **values)

    def log(self, job_id: str, owner: str, line: str) -> None:
        """Append one line to the job's logs (the last 200 are kept)."""
        with self._write() as conn:
            job = self._owned(conn, job_id, owner)
            self._set(conn, job_id, logs_json=_json([*job.logs, line][-MAX_LOG_LINES:]))

    def set_candidate(self, job_id: str, owner: str, candidate_id: str) -> None:
        """Remember the candidate the job proposed (a retry reuses it)."""
        with self._write() as conn:
            self._owned(conn, job_id, owner)
            self._set(conn, job_id, candidate_id=candidate_id)

    def complete(self, job_id: str, owner: str, result: dict[str, Any]) -> Job:
        """Mark the job ``succeeded`` with ``result``; raises ``LeaseLostError`` unless
        ``owner`` holds it."""
        with self._write() as conn:
            self._owned(conn, job_id, owner)
            self._set(
                conn,
                job_id,
                state="succeeded",
                result_json=_json(result),
                progress=1.0,
                lease_owner=None,
                lease_until=None,
                error=None,
            )
            return self._get(conn, job_id)

    def fail(self, job_id: str, owner: str, error: str, retry: bool) -> Job:
        """End this attempt with ``error``: back to ``queued`` when ``retry`` and attempts
        remain, else ``failed``. Raises ``LeaseLostError`` unless ``owner`` holds it."""
        with self._write() as conn:
            job = self._owned(conn, job_id, owner)
            again = retry and job.attempt < self.max_attempts
            self._set(
                conn,
                job_id,
                state="queued" if again else "failed",
                error=error,
                lease_owner=None,
                lease_until=None,
            )
            return self._get(conn, job_id)

    # -- anyone --------------------------------------------------------------------------

    def now(self) -> datetime:
        """The queue's time (its clock's, in UTC), by which leases run out. Raises
        ``InvalidInputError`` when the clock returns a naive datetime."""
        return read_clock(self.clock)

    def cancel(self, job_id: str) -> Job:
        """Cancel a queued or running job (its worker stops at its next heartbeat). A job
        that already ended is returned unchanged. Raises ``JobNotFoundError``."""
        with self._write() as conn:
            job = self._get(conn, job_id)
            if job.state in ACTIVE_STATES:
                self._set(conn, job_id, state="cancelled", lease_owner=None, lease_until=None)
                job = self._get(conn, job_id)
            return job

    def get(self, job_id: str) -> Job:
        """The job; raises ``JobNotFoundError``."""
        with self._read() as conn:
            return self._get(conn, job_id)

    def list(
        self, scenario: str | None = None, state: str | None = None, limit: int = 50
    ) -> builtins.list[Job]:
        """Jobs newest first, optionally of one scenario and/or in one state."""
        _check_state(state)
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInputError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        c = t.jobs.c
        statement = select(t.jobs)
        if scenario is not None:
            statement = statement.where(c.scenario == scenario)
        if state is not None:
            statement = statement.where(c.state == state)
        statement = statement.order_by(c.created_at.desc(), c.id.desc()).limit(limit)
        with self._read() as conn:
            return [_job(row) for row in conn.execute(statement).mappings()]

    def last_job(self, scenario: str) -> Job | None:
        """The scenario's newest job in any state, or None."""
        found = self.list(scenario=scenario, limit=1)
        return found[0] if found else None

    # -- consumed records ----------------------------------------------------------------

    def record_consumed(self, job_id: str, record_ids: Iterable[str]) -> None:
        """Remember that the job trained on these records (idempotent)."""
        rows = [{"record_id": r, "job_id": job_id} for r in dict.fromkeys(record_ids)]
        if rows:
            with self._write() as conn:
                conn.execute(self._insert_consumed, rows)

    def consumed_ids(self, scenario: str, candidates: Collection[str] | None = None) -> set[str]:
        """Record ids consumed by the scenario's ``succeeded`` jobs; with ``candidates``,
        only by those whose candidate is one of them (the published ones, which the
        releases store names: ``ReleaseChain.published_candidate_ids``).

        A job records what it consumed only when it proposes a candidate (a job dropped
        because the head moved consumes nothing).
        """
        j = t.jobs.c
        statement = (
            select(t.consumed.c.record_id)
            .distinct()
            .join(t.jobs, j.id == t.consumed.c.job_id)
            .where(j.scenario == scenario, j.state == "succeeded")
        )
        if candidates is not None:
            statement = statement.where(j.candidate_id.in_(list(candidates)))
        with self._read() as conn:
            return set(conn.scalars(statement))

    def consumed_by(self, job_id: str) -> set[str]:
        """Record ids one job consumed."""
        statement = select(t.consumed.c.record_id).where(t.consumed.c.job_id == job_id)
        with self._read() as conn:
            return set(conn.scalars(statement))

    # -- internals -----------------------------------------------------------------------

    def _get(self, conn: Connection, job_id: str) -> Job:
        row = conn.execute(select(t.jobs).where(t.jobs.c.id == job_id)).mappings().first()
        if row is None:
            raise JobNotFoundError(job_id)
        return _job(row)

    def _owned(self, conn: Connection, job_id: str, owner: str) -> Job:
        job = self._get(conn, job_id)
        if job.state == "cancelled":
            raise JobCancelledError(job_id, owner, "the job was cancelled")
        if job.state != "running":
            raise LeaseLostError(job_id, owner, f"the job is {job.state}")
        if job.lease_owner != owner:
            raise LeaseLostError(job_id, owner, f"{job.lease_owner!r} holds it now")
        return job

    def _set(self, conn: Connection, job_id: str, **values: Any) -> None:
        values["updated_at"] = datetime.now(UTC)
        conn.execute(t.jobs.update().where(t.jobs.c.id == job_id).values(**values))


def job_holdings(conn: Connection, scenario: str) -> dict[str, int]:
    """How many learning jobs ``scenario`` has (any state), read on ``conn`` (the
    transaction of the caller that deletes the scenario if nothing is held)."""
    count = select(func.count()).where(t.jobs.c.scenario == scenario)
    return {"learning job": conn.scalar(count) or 0}

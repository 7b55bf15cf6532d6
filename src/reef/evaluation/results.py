"""``EvaluationStore``: the gate's runs, the items they asked and every scored answer.

One ``evaluations`` row per comparison (candidate or release against a baseline release),
its items in ``eval_items`` (the items that admitted a release stay in force as a
regression suite of every later candidate), one ``eval_results`` row per item, arm and
repeat, and, for ``gate.episodes``, one ``eval_episodes`` row per episode (task, arm and
repeat: how it went and its conversation). Written by the gate, read by the admin API,
the dashboard and reports. Answers and conversations are stored redacted with the
configured ``capture.redact_patterns`` (``EvaluationStore``).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection, RowMapping

from reef.core import dumps, loads, new_id
from reef.core.errors import InvalidInputError, NotFoundError
from reef.db import Database
from reef.db import schema as t
from reef.evaluation.episode_evidence import EpisodeRun
from reef.evaluation.values import Arm, Decision, EvalItem, ItemResult
from reef.experience import Redactor

EvaluationState = Literal["running", "done", "failed"]


class EvaluationNotFoundError(NotFoundError):
    """No evaluation has this id."""

    def __init__(self, evaluation_id: str) -> None:
        super().__init__(f"evaluation {evaluation_id!r} not found")


@dataclass(frozen=True)
class Evaluation:
    """One comparison: ``decision`` is the stored ``Decision.as_dict()`` once done;
    ``meta`` what was compared and how (suites, repeats, settings, cost)."""

    id: str
    scenario: str
    candidate_id: str
    baseline_id: str
    state: EvaluationState
    verdict: str | None
    decision: dict[str, Any] | None
    meta: dict[str, Any]
    created_by: str | None
    created_at: datetime
    finished_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
        return {
            "id": self.id,
            "scenario": self.scenario,
            "candidate_id": self.candidate_id,
            "baseline_id": self.baseline_id,
            "state": self.state,
            "verdict": self.verdict,
            "decision": self.decision,
            "meta": self.meta,
            "created_by": self.created_by,
            "created_at": self.created_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
        }


@dataclass(frozen=True)
class StoredEpisode:
    """One stored episode: ``stop`` as the episode runner gave it (``error`` also when
    the environment failed), ``session_id`` the gateway's session of its records,
    ``messages`` the whole conversation."""

    item_key: str
    task_id: str
    arm: Arm
    repeat: int
    release_id: str
    environment: str
    score: float
    stop: str
    reason: str | None
    error: str | None
    turns: int
    tool_calls: int
    tool_status: dict[str, int]
    session_id: str | None
    record_ids: list[str]
    messages: list[dict[str, Any]]
    seconds: float | None

    def as_dict(self, messages: bool = True) -> dict[str, Any]:
        """JSON-ready form; without the conversation when ``messages`` is false."""
        data = {
            "item": self.item_key,
            "task_id": self.task_id,
            "arm": self.arm,
            "repeat": self.repeat,
            "release_id": self.release_id,
            "environment": self.environment,
            "score": self.score,
            "stop": self.stop,
            "reason": self.reason,
            "error": self.error,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_status": self.tool_status,
            "session_id": self.session_id,
            "record_ids": self.record_ids,
            "seconds": self.seconds,
        }
        if messages:
            data["messages"] = self.messages
        return data


def _episode_row(evaluation_id: str, run: EpisodeRun, redactor: Redactor) -> dict[str, Any]:
    """The ``eval_episodes`` row of ``run``, its conversation, error and reason redacted."""
    result = run.result
    redact = redactor.redact
    return {
        "evaluation_id": evaluation_id,
        "item_key": run.item_key,
        "arm": run.arm,
        "repeat": run.repeat,
        "task_id": run.task_id,
        "release_id": run.release_id,
        "environment": run.suite.partition(":")[2],
        "score": run.score,
        "stop": "error" if result is None else result.stop,
        "reason": redact(run.reason),
        "error": redact(run.error if result is None else result.error),
        "turns": 0 if result is None else result.turns,
        "tool_calls": 0 if result is None else result.tool_calls,
        "tool_status_json": None if result is None else _text(dict(result.tool_status)),
        "session_id": None if result is None else result.session_id,
        "record_ids_json": None if result is None else _text(list(result.record_ids)),
        "messages_json": None if result is None else _text(redact(list(result.messages))),
        "seconds": None if result is None else result.seconds,
    }


def _stored_episode(row: RowMapping) -> StoredEpisode:
    def parsed(column: str, empty: Any) -> Any:
        return empty if row[column] is None else loads(row[column])

    return StoredEpisode(
        item_key=row["item_key"],
        task_id=row["task_id"],
        arm=cast(Arm, row["arm"]),
        repeat=row["repeat"],
        release_id=row["release_id"],
        environment=row["environment"],
        score=row["score"],
        stop=row["stop"],
        reason=row["reason"],
        error=row["error"],
        turns=row["turns"],
        tool_calls=row["tool_calls"],
        tool_status=parsed("tool_status_json", {}),
        session_id=row["session_id"],
        record_ids=parsed("record_ids_json", []),
        messages=parsed("messages_json", []),
        seconds=row["seconds"],
    )


def _text(value: Any) -> str | None:
    return None if value is None else dumps(value).decode()


def _evaluation(row: RowMapping) -> Evaluation:
    return Evaluation(
        id=row["id"],
        scenario=row["scenario"],
        candidate_id=row["candidate_id"],
        baseline_id=row["baseline_id"],
        state=cast(EvaluationState, row["state"]),
        verdict=row["verdict"],
        decision=None if row["decision_json"] is None else loads(row["decision_json"]),
        meta={} if row["meta_json"] is None else loads(row["meta_json"]),
        created_by=row["created_by"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
    )


class EvaluationStore:
    """Evaluations on the ``Database`` the composition root hands it (migrated).

    ``redactor`` (the configured ``capture.redact_patterns``; default: none) scrubs the
    traffic-derived strings before they are written: each result's output, error and
    details, and each episode's conversation, error and reason. Items (from suite files
    or from already-redacted records), decisions and meta are written as given.
    """

    def __init__(self, database: Database, redactor: Redactor | None = None) -> None:
        self.database = database
        self.redactor = redactor or Redactor(())

    def _read(self) -> AbstractContextManager[Connection]:
        return self.database.read()

    def _write(self) -> AbstractContextManager[Connection]:
        return self.database.write()

    def start(
        self,
        scenario: str,
        candidate_id: str,
        baseline_id: str,
        items: Sequence[EvalItem],
        meta: dict[str, Any],
        created_by: str | None,
    ) -> str:
        """A new ``running`` evaluation holding ``items``; its id."""
        keys = [item.key for item in items]
        if len(keys) != len(set(keys)):
            raise InvalidInputError("an evaluation's items must have distinct suite/id keys")
        evaluation_id = new_id()
        with self._write() as conn:
            conn.execute(
                t.evaluations.insert(),
                {
                    "id": evaluation_id,
                    "scenario": scenario,
                    "candidate_id": candidate_id,
                    "baseline_id": baseline_id,
                    "state": "running",
                    "meta_json": _text(meta),
                    "created_by": created_by,
                    "created_at": datetime.now(UTC),
                },
            )
            if items:
                conn.execute(
                    t.eval_items.insert(),
                    [
                        {
                            "evaluation_id": evaluation_id,
                            "item_key": item.key,
                            "suite": item.suite,
                            "item_json": _text(item.as_dict()),
                        }
                        for item in items
                    ],
                )
        return evaluation_id

    def add_results(self, evaluation_id: str, results: Sequence[ItemResult]) -> None:
        """Store scored answers (one row per item, arm and repeat)."""
        if not results:
            return
        redact = self.redactor.redact
        rows = [
            {
                "evaluation_id": evaluation_id,
                "item_key": r.item_key,
                "arm": r.arm,
                "repeat": r.repeat,
                "suite": r.suite,
                "score": r.score,
                "record_id": r.record_id,
                "output": redact(r.output),
                "error": redact(r.error),
                "details_json": _text(redact(r.details)),
                "latency_ms": r.latency_ms,
            }
            for r in results
        ]
        with self._write() as conn:
            conn.execute(t.eval_results.insert(), rows)

    def add_episodes(self, evaluation_id: str, runs: Sequence[EpisodeRun]) -> None:
        """Store played episodes (one row per task, arm and repeat)."""
        if runs:
            rows = [_episode_row(evaluation_id, run, self.redactor) for run in runs]
            with self._write() as conn:
                conn.execute(t.eval_episodes.insert(), rows)

    def episodes(
        self, evaluation_id: str, task_id: str | None = None
    ) -> builtins.list[StoredEpisode]:
        """The evaluation's episodes (of one task when ``task_id`` is given), by task,
        repeat and arm (candidate first)."""
        e = t.eval_episodes.c
        statement = select(t.eval_episodes).where(e.evaluation_id == evaluation_id)
        if task_id is not None:
            statement = statement.where(e.task_id == task_id)
        statement = statement.order_by(e.item_key, e.repeat, e.arm.desc())
        with self._read() as conn:
            rows = conn.execute(statement).mappings().all()
        return [_stored_episode(row) for row in rows]

    def finish(
        self, evaluation_id: str, decision: Decision, meta: dict[str, Any] | None = None
    ) -> Evaluation:
        """Mark the evaluation ``done`` with its decision (and final ``meta``)."""
        values: dict[str, Any] = {
            "state": "done",
            "verdict": decision.verdict,
            "decision_json": _text(decision.as_dict()),
            "finished_at": datetime.now(UTC),
        }
        if meta is not None:
            values["meta_json"] = _text(meta)
        return self._set(evaluation_id, values)

    def fail(self, evaluation_id: str, error: str) -> Evaluation:
        """Mark the evaluation ``failed`` (no decision was reached)."""
        current = self.get(evaluation_id)
        meta = {**current.meta, "error": error}
        values = {"state": "failed", "meta_json": _text(meta), "finished_at": datetime.now(UTC)}
        return self._set(evaluation_id, values)

    def _set(self, evaluation_id: str, values: dict[str, Any]) -> Evaluation:
        e = t.evaluations.c
        with self._write() as conn:
            done = conn.execute(update(t.evaluations).where(e.id == evaluation_id).values(**values))
            if done.rowcount == 0:
                raise EvaluationNotFoundError(evaluation_id)
        return self.get(evaluation_id)

    def get(self, evaluation_id: str) -> Evaluation:
        """The evaluation; raises ``EvaluationNotFoundError``."""
        with self._read() as conn:
            row = (
                conn.execute(select(t.evaluations).where(t.evaluations.c.id == evaluation_id))
                .mappings()
                .first()
            )
        if row is None:
            raise EvaluationNotFoundError(evaluation_id)
        return _evaluation(row)

    def list(
        self, scenario: str | None = None, candidate_id: str | None = None, limit: int = 50
    ) -> list[Evaluation]:
        """Evaluations newest first, optionally of one scenario or candidate."""
        if not 1 <= limit <= 1000:
            raise InvalidInputError(f"limit must be between 1 and 1000, got {limit}")
        e = t.evaluations.c
        statement = select(t.evaluations)
        if scenario is not None:
            statement = statement.where(e.scenario == scenario)
        if candidate_id is not None:
            statement = statement.where(e.candidate_id == candidate_id)
        statement = statement.order_by(e.created_at.desc(), e.id.desc()).limit(limit)
        with self._read() as conn:
            rows = conn.execute(statement).mappings().all()
        return [_evaluation(row) for row in rows]

    def items(self, evaluation_id: str) -> builtins.list[EvalItem]:
        """The items the evaluation asked, in the order they were stored."""
        i = t.eval_items.c
        statement = select(i.item_json).where(i.evaluation_id == evaluation_id).order_by(i.item_key)
        with self._read() as conn:
            return [EvalItem.from_dict(loads(text)) for text in conn.scalars(statement)]

    def results(self, evaluation_id: str) -> builtins.list[ItemResult]:
        """Every scored answer of the evaluation, by item, repeat and arm."""
        r = t.eval_results.c
        statement = (
            select(t.eval_results)
            .where(r.evaluation_id == evaluation_id)
            .order_by(r.item_key, r.repeat, r.arm)
        )
        with self._read() as conn:
            rows = conn.execute(statement).mappings().all()
        return [
            ItemResult(
                item_key=row["item_key"],
                suite=row["suite"],
                arm=cast(Arm, row["arm"]),
                repeat=row["repeat"],
                score=row["score"],
                output=row["output"],
                record_id=row["record_id"],
                error=row["error"],
                details={} if row["details_json"] is None else loads(row["details_json"]),
                latency_ms=row["latency_ms"] or 0.0,
            )
            for row in rows
        ]


def evaluation_holdings(conn: Connection, scenario: str) -> dict[str, int]:
    """How many evaluations ``scenario`` has, read on ``conn`` (the transaction of the
    caller that deletes the scenario if nothing is held)."""
    count = select(func.count()).where(t.evaluations.c.scenario == scenario)
    return {"evaluation": conn.scalar(count) or 0}

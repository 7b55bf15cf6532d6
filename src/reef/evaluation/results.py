"""``EvaluationStore``: the gate's runs, the items they asked and every scored answer.

One ``evaluations`` row per comparison (candidate or release against a baseline release),
its items in ``eval_items`` (the items that admitted a release stay in force as a
regression suite of every later candidate) and one ``eval_results`` row per item, arm and
repeat. Written by the gate, read by the admin API, the dashboard and reports.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import select, update
from sqlalchemy.engine import Connection, RowMapping

from reef.core import dumps, loads, new_id
from reef.core.errors import InvalidInputError, NotFoundError
from reef.db import Database
from reef.db import schema as t
from reef.evaluation.values import Arm, Decision, EvalItem, ItemResult

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
    """Evaluations on the ``Database`` the composition root hands it (migrated)."""

    def __init__(self, database: Database) -> None:
        self.database = database

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
        rows = [
            {
                "evaluation_id": evaluation_id,
                "item_key": r.item_key,
                "arm": r.arm,
                "repeat": r.repeat,
                "suite": r.suite,
                "score": r.score,
                "record_id": r.record_id,
                "output": r.output,
                "error": r.error,
                "details_json": _text(r.details),
                "latency_ms": r.latency_ms,
            }
            for r in results
        ]
        with self._write() as conn:
            conn.execute(t.eval_results.insert(), rows)

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

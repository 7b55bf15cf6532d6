"""The learning curve: per release, what live traffic it served and how it was scored.

One SQL query over the records, their feedback and the release chain's releases (the
tables share one database), for the dashboard's curve (``GET /reef/scenarios/{s}/curve``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, literal, select

from reef.core import loads
from reef.db import Database
from reef.db import schema as t


def learning_curve(database: Database, scenario: str, limit: int = 200) -> list[dict[str, Any]]:
    """The newest ``limit`` releases of ``scenario``, oldest first, each with ``served``
    (its ``serve`` records), ``scored`` and ``mean_score`` (the feedback scores on those
    records; ``None`` without any) and ``gate`` (the gate's overall means when the gate
    admitted the release, else ``None``). Raises ``StoreUnavailableError``."""
    rec, refs, fb, rel = t.records.c, t.feedback_refs.c, t.feedback.c, t.releases.c
    live = (rec.scenario == scenario) & (rec.purpose == "serve")
    served = (
        select(rec.release_id.label("release_id"), func.count().label("n"))
        .where(live)
        .group_by(rec.release_id)
        .subquery()
    )
    scored = (
        select(
            rec.release_id.label("release_id"),
            func.count(fb.score).label("n"),
            func.avg(fb.score).label("mean"),
        )
        .select_from(
            t.records.join(t.feedback_refs, refs.record_id == rec.id).join(
                t.feedback, fb.id == refs.feedback_id
            )
        )
        .where(live & fb.score.is_not(None))
        .group_by(rec.release_id)
        .subquery()
    )
    statement = (
        select(
            rel.id,
            rel.seq,
            rel.operation,
            rel.created_at,
            rel.created_by,
            rel.eval_json,
            func.coalesce(served.c.n, literal(0)).label("served"),
            func.coalesce(scored.c.n, literal(0)).label("scored"),
            scored.c.mean,
        )
        .outerjoin(served, served.c.release_id == rel.id)
        .outerjoin(scored, scored.c.release_id == rel.id)
        .where(rel.scenario == scenario)
        .order_by(rel.seq.desc())
        .limit(limit)
    )
    with database.read() as conn:
        rows = conn.execute(statement).mappings().all()
    return [
        {
            "release_id": row["id"],
            "seq": row["seq"],
            "operation": row["operation"],
            "created_at": row["created_at"].isoformat(),
            "created_by": row["created_by"],
            "served": int(row["served"]),
            "scored": int(row["scored"]),
            "mean_score": None if row["mean"] is None else float(row["mean"]),
            "gate": _gate_means(row["eval_json"]),
        }
        for row in reversed(rows)
    ]


def _gate_means(eval_json: str | None) -> dict[str, Any] | None:
    """The gate's overall numbers in a release's evidence, or None."""
    evidence = loads(eval_json) if eval_json else None
    gate = evidence.get("gate") if isinstance(evidence, dict) else None
    decision = gate.get("decision") if isinstance(gate, dict) else None
    overall = decision.get("overall") if isinstance(decision, dict) else None
    if not isinstance(decision, dict) or not isinstance(overall, dict):
        return None
    return {
        "verdict": decision.get("verdict"),
        "candidate_mean": overall.get("candidate_mean"),
        "baseline_mean": overall.get("baseline_mean"),
        "items": overall.get("items"),
    }

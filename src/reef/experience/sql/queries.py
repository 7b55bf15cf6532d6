"""Statements and query pieces of ``SQLExperienceStore`` that are not one-liners."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Integer,
    Select,
    and_,
    bindparam,
    exists,
    literal_column,
    select,
    text,
    union_all,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from reef.core.jsoncodec import dumps
from reef.db import schema as t
from reef.experience.importing.base import ORIGIN_TAG
from reef.experience.records import FeedbackView, RecordFilter
from reef.experience.sql.rows import feedback_view

# A conversation longer than this many turns is matched on its latest turns only.
MAX_CONTINUATION_HASHES = 256

# Hot-path statements are built once: building costs more than running them on SQLite.
FIND_BY_KEY = select(t.records.c.id).where(
    t.records.c.scenario == bindparam("scenario"),
    t.records.c.idempotency_key == bindparam("key"),
)

PG_MAX_TURNS = text(
    "SELECT s.session_id, (SELECT max(r.turn) FROM records r"
    " WHERE r.scenario = :scenario AND r.session_id = s.session_id)"
    " FROM unnest(CAST(:sessions AS text[])) AS s(session_id)"
)


def feedback_for(
    conn: Connection, record_ids: Sequence[str]
) -> dict[str, tuple[FeedbackView, ...]]:
    """Feedback of each record in ``record_ids``, oldest first."""
    if not record_ids:
        return {}
    refs, fb = t.feedback_refs, t.feedback
    pairs = (
        conn.execute(
            select(refs.c.record_id, fb)
            .join(fb, fb.c.id == refs.c.feedback_id)
            .where(refs.c.record_id.in_(record_ids))
            .order_by(fb.c.created_at, fb.c.id)
        )
        .mappings()
        .all()
    )
    if not pairs:
        return {}
    feedback_ids = list(dict.fromkeys(pair["id"] for pair in pairs))
    targets: dict[str, list[str]] = defaultdict(list)
    for feedback_id, record_id in conn.execute(
        select(refs.c.feedback_id, refs.c.record_id)
        .where(refs.c.feedback_id.in_(feedback_ids))
        .order_by(refs.c.feedback_id, refs.c.position)
    ):
        targets[feedback_id].append(record_id)
    views: dict[str, FeedbackView] = {}
    result: dict[str, list[FeedbackView]] = defaultdict(list)
    for pair in pairs:
        view = views.get(pair["id"])
        if view is None:
            view = views[pair["id"]] = feedback_view(pair, tuple(targets[pair["id"]]))
        result[pair["record_id"]].append(view)
    return {record_id: tuple(found) for record_id, found in result.items()}


@functools.lru_cache(maxsize=MAX_CONTINUATION_HASHES)
def find_session_statement(count: int) -> Select[Any]:
    """The newest record for each of ``count`` hashes, the earliest-listed hash first.

    One round trip; each branch is a backward scan of the continuation index that stops
    at one row. Built once per ``count``: constructing it costs more than running it.
    """
    r = t.records.c
    branches = [
        select(literal_column(str(position), Integer).label("position"), r.id, r.session_id, r.turn)
        .where(
            r.scenario == bindparam("scenario"), r.continuation_hash == bindparam(f"h{position}")
        )
        .order_by(r.created_at.desc(), r.id.desc())
        .limit(1)
        .subquery()
        for position in range(count)
    ]
    candidates = union_all(*(select(branch) for branch in branches)).subquery()
    return select(candidates).order_by(candidates.c.position).limit(1)


LIVE_ORIGIN = "live"


def _origin_clause(origin: str) -> ColumnElement[bool]:
    """Records whose ``reef.origin`` tag is ``origin`` (``live``: records without one).

    Tags are stored as compact JSON text (``orjson``), so the pair appears verbatim; a
    substring match needs no JSON functions, which SQLite and PostgreSQL spell apart."""
    r = t.records.c
    key = dumps(ORIGIN_TAG).decode()
    if origin == LIVE_ORIGIN:
        return ~r.tags_json.contains(f"{key}:", autoescape=True)
    return r.tags_json.contains(f"{key}:{dumps(origin).decode()}", autoescape=True)


def filter_clauses(filters: RecordFilter) -> list[ColumnElement[bool]]:
    r, refs, fb = t.records.c, t.feedback_refs.c, t.feedback.c
    clauses: list[ColumnElement[bool]] = []
    if filters.session_id is not None:
        clauses.append(r.session_id == filters.session_id)
    if filters.purpose is not None:
        clauses.append(r.purpose == filters.purpose)
    if filters.since is not None:
        clauses.append(r.created_at >= filters.since)
    if filters.origin is not None:
        clauses.append(_origin_clause(filters.origin))
    if filters.has_feedback is not None:
        any_feedback = exists().where(refs.record_id == r.id)
        clauses.append(any_feedback if filters.has_feedback else ~any_feedback)
    if filters.min_score is not None:
        # "Some feedback scored at least min_score" is the same as "the best one did".
        clauses.append(
            exists().where(
                and_(
                    refs.record_id == r.id,
                    fb.id == refs.feedback_id,
                    fb.score >= filters.min_score,
                )
            )
        )
    return clauses

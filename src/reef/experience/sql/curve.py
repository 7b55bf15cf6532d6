"""Questions about a scenario that other parts ask of the experience store's tables.

``release_traffic``: the live traffic behind each release of a scenario, what it served
and how that was scored, for the learning curve (``GET /reef/scenarios/{s}/curve``, which
joins it to the release chain's releases through the chain's face): one SQL query over
the records and their feedback. ``experience_holdings``: what a scenario holds here, for
the release chain deleting a scenario (``ReleaseChain.forget_scenario``, in its
transaction).
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from reef.db import Database
from reef.db import schema as t
from reef.experience.records import ReleaseTraffic


def release_traffic(
    database: Database, scenario: str, release_ids: Collection[str]
) -> dict[str, ReleaseTraffic]:
    """For each of ``release_ids`` that served live (``serve``) records of ``scenario``:
    how many (``served``), how many feedback scores those records got (``scored``) and
    their mean (``None`` without any). Releases that served nothing are left out.
    Raises ``StoreUnavailableError``."""
    if not release_ids:
        return {}
    rec, refs, fb = t.records.c, t.feedback_refs.c, t.feedback.c
    live = (rec.scenario == scenario) & (rec.purpose == "serve") & rec.release_id.in_(release_ids)
    served = select(rec.release_id, func.count()).where(live).group_by(rec.release_id)
    scored = (
        select(rec.release_id, func.count(fb.score), func.avg(fb.score))
        .select_from(
            t.records.join(t.feedback_refs, refs.record_id == rec.id).join(
                t.feedback, fb.id == refs.feedback_id
            )
        )
        .where(live & fb.score.is_not(None))
        .group_by(rec.release_id)
    )
    with database.read() as conn:
        counts = {release: int(n) for release, n in conn.execute(served)}
        scores = {release: (int(n), mean) for release, n, mean in conn.execute(scored)}
    traffic = {}
    for release, n in counts.items():
        scored_n, mean = scores.get(release, (0, None))
        traffic[release] = ReleaseTraffic(
            served=n, scored=scored_n, mean_score=None if mean is None else float(mean)
        )
    return traffic


def experience_holdings(conn: Connection, scenario: str) -> dict[str, int]:
    """How many records and stored responses ``scenario`` holds, read on ``conn`` (the
    transaction of the caller that deletes the scenario if nothing is held)."""
    records = select(func.count()).where(t.records.c.scenario == scenario)
    responses = select(func.count()).where(t.responses.c.scenario == scenario)
    return {
        "record": conn.scalar(records) or 0,
        "stored response": conn.scalar(responses) or 0,
    }

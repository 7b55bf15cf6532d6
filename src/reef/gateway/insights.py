"""Admin reads for the dashboard: a scenario's learning curve, its jobs, and a harness by
its artifact digest.

- ``GET /reef/scenarios/{s}/curve?limit=``: per release (oldest first) how many live
  (``serve``) requests it answered, the mean feedback score of those requests, and the
  gate's candidate and baseline means when the gate admitted it — one SQL query;
- ``GET /reef/scenarios/{s}/jobs?state=&limit=``: learning jobs newest first;
- ``GET /reef/artifacts/{digest}/harness``: the harness of a release or candidate, as
  JSON. Only a digest that some release or candidate names as its harness is read, so the
  route cannot be used to read arbitrary artifacts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, literal, select
from sqlalchemy.engine import Engine
from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps, loads
from reef.core.errors import NotFoundError
from reef.experience import schema as t
from reef.experience.jobs import JobQueue
from reef.experience.sqlengine import unavailable_on_failure
from reef.gateway.requests import check_scenario_name, query_int
from reef.gateway.state import GatewayState
from reef.harness.packing import read_bundle_archive
from reef.releases import ReleaseManifest
from reef.releases.artifacts import digest_hex

_MAX_TEXT_FILE_BYTES = 64 * 1024


def _json(data: Any, status: int = 200) -> Response:
    return Response(dumps(data), status_code=status, media_type="application/json")


def _limit(request: Request, default: int, most: int) -> int:
    return query_int(request, "limit", default, 1, most)


def learning_curve(engine: Engine, scenario: str, limit: int = 200) -> list[dict[str, Any]]:
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
    with unavailable_on_failure(), engine.connect() as conn:
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


def harness_owners(engine: Engine, digest: str) -> list[dict[str, str]]:
    """Every release and candidate whose manifest names ``digest`` as its harness
    (``[{"kind", "id", "scenario"}]``). Raises ``InvalidDigestError`` for a malformed
    digest and ``StoreUnavailableError``."""
    digest_hex(digest)  # a well-formed digest holds only [a-z0-9:], safe inside LIKE
    pattern = f"%{digest}%"
    owners: list[dict[str, str]] = []
    with unavailable_on_failure(), engine.connect() as conn:
        for kind, table in (("release", t.releases), ("candidate", t.candidates)):
            statement = select(table.c.id, table.c.scenario, table.c.manifest_json).where(
                table.c.manifest_json.like(pattern)
            )
            for row in conn.execute(statement).mappings():
                # LIKE narrows; the parsed manifest decides (the digest may be an adapter's)
                manifest = ReleaseManifest.from_json(loads(row["manifest_json"]))
                if manifest.harness == digest:
                    owners.append({"kind": kind, "id": row["id"], "scenario": row["scenario"]})
    return owners


def _files_json(files: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """A bundle's extra files: path, size, and the text of a small UTF-8 file."""
    out = []
    for path, data in files.items():
        text: str | None = None
        if len(data) <= _MAX_TEXT_FILE_BYTES:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        out.append({"path": path, "size_bytes": len(data), "text": text})
    return out


class InsightRoutes:
    """The dashboard's extra reads; every one needs an admin key when keys are set."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    @property
    def _engine(self) -> Engine:
        return self.state.store.engine

    async def curve(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/curve?limit=``."""
        self.state.auth.authenticate(request).require_admin()
        scenario = check_scenario_name(request.path_params["scenario"])
        limit = _limit(request, 200, 1000)
        data = await asyncio.to_thread(learning_curve, self._engine, scenario, limit)
        score_range = list(self.state.settings.scenario(scenario).score_range)
        return _json({"scenario": scenario, "score_range": score_range, "data": data})

    async def jobs(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/jobs?state=&limit=``: newest first."""
        self.state.auth.authenticate(request).require_admin()
        scenario = check_scenario_name(request.path_params["scenario"])
        limit = _limit(request, 20, 1000)
        queue = JobQueue(self._engine)
        found = await asyncio.to_thread(
            queue.list, scenario, request.query_params.get("state"), limit
        )
        return _json({"data": [job.as_dict() for job in found]})

    async def harness(self, request: Request) -> Response:
        """``GET /reef/artifacts/{digest}/harness``: ``{digest, named_by, harness, files}``."""
        self.state.auth.authenticate(request).require_admin()
        digest = request.path_params["digest"]
        owners = await asyncio.to_thread(harness_owners, self._engine, digest)
        if not owners:
            raise NotFoundError(f"no release or candidate has the harness {digest!r}")
        artifacts = self.state.activation.artifacts
        data = await asyncio.to_thread(artifacts.read_bytes, digest)
        bundle = await asyncio.to_thread(read_bundle_archive, data)
        return _json(
            {
                "digest": digest,
                "named_by": owners,
                "harness": bundle.harness.model_dump(mode="json"),
                "files": _files_json(bundle.files),
            }
        )

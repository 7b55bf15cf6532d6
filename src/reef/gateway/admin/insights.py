"""Admin reads for the dashboard: a scenario's learning curve, its jobs, and a harness by
its artifact digest.

- ``GET /reef/scenarios/{s}/curve?limit=``: per release (oldest first) how many live
  (``serve``) requests it answered, the mean feedback score of those requests, and the
  gate's candidate and baseline means when the gate admitted it (``learning_curve``: the
  release chain's releases joined to ``ExperienceStore.release_traffic``);
- ``GET /reef/scenarios/{s}/jobs?state=&limit=``: learning jobs newest first;
- ``GET /reef/scenarios/{s}/feedback/calibration``: each computed feedback source
  measured against posted feedback (``reef.experience.calibration``);
- ``GET /reef/costs?since=&by=``: what the recorded traffic cost since a time, per
  scenario, key (or release) and purpose (``reef.experience.spend_since``, what ``reef
  costs`` prints), of the key's scenarios;
- ``GET /reef/artifacts/{digest}/harness``: the harness of a release or candidate, as
  JSON. Only a digest that some release or candidate names as its harness is read, so the
  route cannot be used to read arbitrary artifacts.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps
from reef.core.clock import SINCE_PATTERN, since_time
from reef.core.errors import InvalidInputError, NotFoundError
from reef.experience import ExperienceStore, ReleaseTraffic, calibrate, spend_since
from reef.gateway.auth import grant_of
from reef.gateway.requests import check_scenario_name, query_int
from reef.gateway.state import GatewayState
from reef.harness.packing import read_bundle_archive
from reef.releases import ReleaseChain

_MAX_TEXT_FILE_BYTES = 64 * 1024
COST_GROUPS = ("key", "release")  # ``GET /reef/costs?by=``


def _json(data: Any, status: int = 200) -> Response:
    return Response(dumps(data), status_code=status, media_type="application/json")


def _limit(request: Request, default: int, most: int) -> int:
    return query_int(request, "limit", default, 1, most)


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


def learning_curve(
    store: ExperienceStore, chain: ReleaseChain, scenario: str, limit: int = 200
) -> list[dict[str, Any]]:
    """The newest ``limit`` releases of ``scenario``, oldest first, each with ``served``
    (its ``serve`` records), ``scored`` and ``mean_score`` (the feedback scores on those
    records; ``None`` without any) and ``gate`` (the gate's overall means when the gate
    admitted the release, else ``None``): the chain's releases, the experience store's
    traffic, each asked through its own store."""
    releases = chain.releases(scenario, limit)
    traffic = store.release_traffic(scenario, [release.id for release in releases])
    none = ReleaseTraffic(served=0, scored=0, mean_score=None)
    return [
        {
            "release_id": release.id,
            "seq": release.seq,
            "operation": release.operation,
            "created_at": release.created_at.isoformat(),
            "created_by": release.created_by,
            **asdict(traffic.get(release.id, none)),
            "gate": _gate_means(release.evidence),
        }
        for release in reversed(releases)
    ]


def _gate_means(evidence: dict[str, Any] | None) -> dict[str, Any] | None:
    """The gate's overall numbers in a release's evidence, or None."""
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


class InsightRoutes:
    """The dashboard's extra reads (access: ``reef.gateway.routes``)."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def curve(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/curve?limit=``."""
        scenario = check_scenario_name(request.path_params["scenario"])
        limit = _limit(request, 200, 1000)
        chain = self.state.activation.chain
        data = await asyncio.to_thread(learning_curve, self.state.store, chain, scenario, limit)
        score_range = list(self.state.settings.scenario(scenario).score_range)
        return _json({"scenario": scenario, "score_range": score_range, "data": data})

    async def costs(self, request: Request) -> Response:
        """``GET /reef/costs?since=7d&by=key|release``: the rows of ``reef costs``, those
        of the key's scenarios (a 400 names a bad ``since`` or ``by``)."""
        by = request.query_params.get("by", "key")
        if by not in COST_GROUPS:
            raise InvalidInputError(f"query parameter 'by' must be key or release, not {by[:40]!r}")
        since = request.query_params.get("since", "7d")
        try:
            if re.search(SINCE_PATTERN, since) is None:
                raise InvalidInputError(
                    f"{since[:40]!r} is neither an age (30m, 24h, 7d) nor an ISO 8601 time "
                    "(2026-05-01T12:00:00Z)"
                )
            start = since_time(since, self.state.spend.clock())
        except InvalidInputError as exc:
            raise InvalidInputError(f"query parameter 'since': {exc}") from None
        group: Literal["key", "release"] = "release" if by == "release" else "key"
        rows = await asyncio.to_thread(spend_since, self.state.database, start, group)
        grant = grant_of(request)
        grant.checked = True  # a key allowed no spent-on scenario sees no row
        data = [asdict(row) for row in rows if grant.visible(row.scenario)]
        iso = start.isoformat().replace("+00:00", "Z")
        return _json({"since": iso, "by": by, "data": data})

    async def jobs(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/jobs?state=&limit=``: newest first."""
        scenario = check_scenario_name(request.path_params["scenario"])
        limit = _limit(request, 20, 1000)
        found = await asyncio.to_thread(
            self.state.jobs.list, scenario, request.query_params.get("state"), limit
        )
        return _json({"data": [job.as_dict() for job in found]})

    async def calibration(self, request: Request) -> Response:
        """``GET /reef/scenarios/{scenario}/feedback/calibration``: ``{scenario, data}``."""
        scenario = check_scenario_name(request.path_params["scenario"])
        found = await asyncio.to_thread(calibrate, self.state.store, scenario)
        return _json({"scenario": scenario, "data": [source.as_dict() for source in found]})

    async def harness(self, request: Request) -> Response:
        """``GET /reef/artifacts/{digest}/harness``: ``{digest, named_by, harness, files}``
        (``named_by``: the releases and candidates of the key's scenarios that name it)."""
        grant = grant_of(request)
        digest = request.path_params["digest"]
        owners = await asyncio.to_thread(self.state.activation.chain.harness_owners, digest)
        owners = [owner for owner in owners if grant.visible(owner["scenario"])]
        grant.checked = True  # an unnamed digest is a 404 below, for every key
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

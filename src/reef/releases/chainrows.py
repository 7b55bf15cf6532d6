"""Rows of ``releases`` and ``candidates`` to values and back."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy.engine import RowMapping

from reef.core import dumps, loads
from reef.core.errors import InvalidInputError
from reef.releases.manifest import ReleaseManifest
from reef.releases.values import Candidate, CandidateState, Operation, Release


def evidence_text(evidence: dict[str, Any] | None) -> str | None:
    """Evidence as stored JSON text; raises ``InvalidInputError`` when not serializable."""
    if evidence is None:
        return None
    if not isinstance(evidence, dict):
        raise InvalidInputError(f"evidence must be a JSON object, got {type(evidence).__name__}")
    try:
        return dumps(evidence).decode()
    except TypeError as error:
        raise InvalidInputError(f"evidence is not JSON-serializable: {error}") from error


def _evidence(text: str | None) -> dict[str, Any] | None:
    return None if text is None else cast(dict[str, Any], loads(text))


def release_from_row(row: RowMapping) -> Release:
    """A ``Release`` from a ``releases`` row."""
    return Release(
        id=row["id"],
        scenario=row["scenario"],
        seq=row["seq"],
        parent_id=row["parent_id"],
        operation=cast(Operation, row["operation"]),
        manifest=ReleaseManifest.from_json(loads(row["manifest_json"])),
        evidence=_evidence(row["eval_json"]),
        created_by=row["created_by"],
        reason=row["reason"],
        created_at=row["created_at"],
        candidate_id=row["candidate_id"],
        rolled_back_to=row["rolled_back_to"],
    )


def candidate_from_row(row: RowMapping) -> Candidate:
    """A ``Candidate`` from a ``candidates`` row (rows from before 0002 lack
    ``updated_at``: their creation time stands in)."""
    return Candidate(
        id=row["id"],
        scenario=row["scenario"],
        parent_release_id=row["parent_release_id"],
        manifest=ReleaseManifest.from_json(loads(row["manifest_json"])),
        state=cast(CandidateState, row["state"]),
        evidence=_evidence(row["eval_json"]),
        created_by=row["created_by"],
        reason=row["reason"],
        created_at=row["created_at"],
        updated_at=row["updated_at"] or row["created_at"],
    )


def release_row(release: Release) -> dict[str, Any]:
    """The ``releases`` row of ``release``; the manifest column holds the full DESIGN.md §3
    document (components, parent, operation), so a row read alone is self-describing."""
    return {
        "id": release.id,
        "scenario": release.scenario,
        "seq": release.seq,
        "parent_id": release.parent_id,
        "operation": release.operation,
        "manifest_json": dumps(release.manifest_json()).decode(),
        "eval_json": evidence_text(release.evidence),
        "created_by": release.created_by,
        "reason": release.reason,
        "created_at": release.created_at,
        "candidate_id": release.candidate_id,
        "rolled_back_to": release.rolled_back_to,
    }


def manifest_digests(manifest_json: str) -> set[str]:
    """Artifact digests named by a stored manifest, read leniently (no validation), so a
    malformed row can never make ``reef gc`` think an artifact is unreachable."""
    data = loads(manifest_json)
    found: set[str] = set()
    if not isinstance(data, dict):
        return found
    model = data.get("model")
    candidates = [data.get("harness")]
    if isinstance(model, dict):
        candidates += [model.get("adapter"), model.get("checkpoint")]
    found.update(d for d in candidates if isinstance(d, str))
    return found

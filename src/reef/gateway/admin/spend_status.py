"""``/reef/status``'s ``spend`` beyond the serving budgets (``SpendControl.status_json``):
the cost of each release, and of each scenario, key and purpose, over the last
``RELEASE_DAYS`` days (the records' costs, summed in the store:
``reef.experience.spend_by_release``, ``spend_by_key``), each learning budget in its
current window (``learning_budgets``), and the cost of each recent
learning job and of its gate decision (the job's ``cost`` and ``gate.cost.spend``,
``reef.experience.learning_spend``). ``tests/gateway/test_spend_status.py``."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from reef.config.spend import LearningBudgetLimit
from reef.experience import LearningMeter, spend_by_key, spend_by_release
from reef.gateway.state import GatewayState
from reef.jobs import Job

RELEASE_DAYS = 30
LEARNING_JOBS = 20  # the newest finished jobs shown


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def release_and_learning_spend(state: GatewayState, now: datetime) -> dict[str, Any]:
    """``releases_since``, ``releases`` (``{scenario, release, requests, unpriced,
    cost}``, costliest first), ``keys`` (``{scenario, key, purpose, requests, unpriced,
    cost}``, costliest first, over the same days) and ``learning`` (``{job_id, scenario, outcome,
    candidate_id, finished_at, cost, gate}``, newest first; ``gate`` is ``{action,
    spend}`` or None). Blocking: run it in a thread."""
    since = now - timedelta(days=RELEASE_DAYS)
    releases = [asdict(row) for row in spend_by_release(state.database, since)]
    keys = [asdict(row) for row in spend_by_key(state.database, since)]
    jobs = state.jobs.list(state="succeeded", limit=LEARNING_JOBS)
    learning = [row for row in map(_job_spend, jobs) if row is not None]
    return {
        "releases_since": _iso(since),
        "releases": releases,
        "keys": keys,
        "learning": learning,
        "learning_budgets": learning_budgets(state, now),
    }


def learning_budgets(state: GatewayState, now: datetime) -> list[dict[str, Any]]:
    """Every configured ``learning_budget`` (each scenario's and its recipe file's) in
    its current window: what the store's ledger counted and the limits, with
    ``scenario`` (``LearningMeter.status``). A recipe file that cannot be read shows
    nothing here (the worker reports why)."""
    rows = []
    for scenario, config in state.settings.scenarios.items():
        budgets = [(f"scenario:{scenario}", config.learning_budget)]
        if config.recipe is not None:
            budgets += _recipe_budgets(config.recipe)
        meter = LearningMeter(state.database, budgets, lambda: now)
        rows += [{"scenario": scenario, **row} for row in meter.status()]
    return rows


def _recipe_budgets(path: Path) -> list[tuple[str, list[LearningBudgetLimit]]]:
    """The ``learning_budget`` of the recipe file at ``path``, under its scope
    (``recipe:<name>``, the name defaulting to the file's stem as the worker's)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            return []
        limits = [
            LearningBudgetLimit.model_validate(raw) for raw in data.get("learning_budget") or []
        ]
    except (OSError, yaml.YAMLError, ValueError, TypeError):
        return []
    name = data.get("name") or path.stem
    return [(f"recipe:{name}", limits)]


def _job_spend(job: Job) -> dict[str, Any] | None:
    """What one finished job and its gate decision cost; None for a job without a tally."""
    result = job.result or {}
    cost = result.get("cost")
    if not isinstance(cost, dict):
        return None
    gate = result.get("gate")
    gate_cost = gate.get("cost") if isinstance(gate, dict) else None
    gate_spend = gate_cost.get("spend") if isinstance(gate_cost, dict) else None
    return {
        "job_id": job.id,
        "scenario": job.scenario,
        "outcome": result.get("outcome"),
        "candidate_id": job.candidate_id,
        "finished_at": _iso(job.updated_at),
        "cost": cost,
        "gate": None
        if gate_spend is None or not isinstance(gate, dict)
        else {"action": gate.get("action"), "spend": gate_spend},
    }

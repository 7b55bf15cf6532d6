"""Resuming undecided gate decisions: the worker's, with no new job.

A candidate the gate left ``undecided`` stays ``evaluating``; its evidence keeps the
verdict history (``evidence["gate"]["history"]``: one look per evaluation, with the
paired items per suite and the void items). On every pass the worker looks at each
such candidate of a scenario whose recipe gates, and runs the gate again when:

- the last look ran out of a learning budget (``budget_resets``): once, and only once,
  that budget's window has reset (``tests/learning/test_learning_budget.py``); else

- new held-out traffic with feedback gave more holdout items than the last look used;
- with ``gate.shadow``, the candidate has more shadow pairs, or more of them have a
  reference (a correction on the live answer), than the last look read;
- the last look had void items (an outage), asked again ``VOID_RETRY_SECONDS`` after it;
- ``gate.max_wait_hours`` has passed since the first look (the gate then rejects it as
  "insufficient evidence" unless the new look decides).

The gate's own limits (``max_evidence``, ``max_wait_hours``, no evidence to come) end
the wait with a rejection. ``tests/learning/test_undecided.py`` shows a candidate
undecided on a few held-out items published once more traffic arrives, and one
published once live traffic gave it shadow pairs; ``tests/e2e/test_shadow_loop.py`` the
same on the tiny model, from a learning job to the dashboard's decision.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from reef.core import SilentProgress
from reef.evaluation import GateOutcome, shadow_progress
from reef.learning.holdout import build_gate, select_holdout
from reef.learning.recipes import Recipe
from reef.releases import Candidate

if TYPE_CHECKING:
    from reef.learning.worker import Worker

log = logging.getLogger("reef.worker")

VOID_RETRY_SECONDS = 60.0
"""How long after a look with void items (an outage) they are asked again."""


@dataclass(frozen=True)
class Resumption:
    """One undecided candidate the worker looked at: ``reason`` it was evaluated again
    (None: nothing new, it keeps waiting) and the gate's ``outcome`` when it was."""

    scenario: str
    candidate_id: str
    reason: str | None
    outcome: GateOutcome | None = None


def last_look(candidate: Candidate) -> dict[str, Any] | None:
    """The candidate's latest gate look when its verdict was undecided; else None."""
    gate = (candidate.evidence or {}).get("gate") or {}
    history = gate.get("history") or []
    if not history or history[-1].get("verdict") != "undecided":
        return None
    look: dict[str, Any] = history[-1]
    return look


def _why_again(
    look: dict[str, Any],
    first: datetime,
    holdout_items: int,
    shadow: dict[str, int] | None,
    recipe: Recipe,
    now: datetime,
) -> str | None:
    resets = look.get("budget_resets")  # a learning budget ran out mid-evaluation
    if resets is not None:
        if now < datetime.fromisoformat(resets):
            return None  # asking again before its window resets would be refused
        return "the learning budget's window reset"
    seen = int((look.get("suites") or {}).get("holdout", 0))
    if recipe.gate.holdout and holdout_items > seen:
        return f"{holdout_items - seen} new held-out items"
    if shadow is not None:
        read = look.get("shadow") or {}
        for key, what in (("pairs", "new shadow pairs"), ("references", "new references")):
            grown = shadow[key] - int(read.get(key, 0))
            if grown > 0:
                return f"{grown} {what}"
    since = (now - datetime.fromisoformat(look["at"])).total_seconds()
    if int(look.get("void", 0)) and since >= VOID_RETRY_SECONDS:
        return f"{look['void']} void items to ask again"
    if (now - first).total_seconds() >= recipe.gate.max_wait_hours * 3600.0:
        return "max_wait_hours passed"
    return None


def resume_undecided(worker: Worker) -> list[Resumption]:
    """Evaluate again every undecided candidate with new evidence (module docstring);
    what was done with each."""
    done = []
    now = worker.queue.now()
    for scenario, recipe in worker.recipes().items():
        if not recipe.gate.enabled:
            continue
        waiting = [
            (candidate, look)
            for candidate in worker.chain.candidates(scenario, state="evaluating", limit=100)
            if (look := last_look(candidate)) is not None
        ]
        if not waiting:
            continue
        held = select_holdout(worker.store, worker.chain, scenario, recipe)
        for candidate, look in waiting:
            history = ((candidate.evidence or {}).get("gate") or {}).get("history") or [look]
            first = datetime.fromisoformat(history[0]["at"])
            shadow = (
                None
                if recipe.gate.shadow is None
                else shadow_progress(worker.store, scenario, candidate.id, recipe.gate)
            )
            reason = _why_again(look, first, len(held.items), shadow, recipe, now)
            if reason is None:
                done.append(Resumption(scenario, candidate.id, None))
                continue
            log.info("undecided candidate %s: evaluating again (%s)", candidate.id, reason)
            gate = build_gate(
                worker.settings,
                worker.chain,
                worker.evaluations,
                worker.artifacts,
                scenario,
                recipe,
                progress=SilentProgress(),
                upstream_base_urls=worker.upstream_base_urls,
                meter=worker.meter_for(scenario, recipe),
                store=worker.store,
            )
            outcome = gate.run(candidate.id, held.items, now=now)
            log.info("candidate %s: %s", candidate.id, outcome.action)
            done.append(Resumption(scenario, candidate.id, reason, outcome))
    return done

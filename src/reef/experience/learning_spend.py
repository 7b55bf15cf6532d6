"""Reef's own learning spend: what a job and a gate cost, and the ``learning_budget``
that caps it (``docs/costs.md#reefs-own-spending``).

A ``LearningMeter`` belongs to one learning job (or one gate run the worker resumes).
Before each model call Reef's machinery makes, ``admit(purpose)`` checks every budget
of the recipe and the scenario that counts that purpose (its own, and ``total``) in
the current window: one that has reached a limit raises ``LearningBudgetExhaustedError``
naming it, and the call is not made. After the call, ``charge`` adds it (one call, its
tokens, its money when the model is priced) to the job's tally and to each window.
Training time is admitted before a learner that trains a model and charged, in CPU or
GPU minutes, when it ends (``train``); the minutes the tightest budget has left are the
trainer's deadline (``training_minutes_left``), and a trainer that reaches it stops
mid-run: the job ends ``budget_exhausted`` (``training_exhausted``) with nothing
proposed.

Windows are counted in the store's ``spend_windows`` (rows named ``learn:<scope>:...``,
``scope`` being ``scenario:<name>`` or ``recipe:<name>``), so every worker on the store
sees them; admission reads and charging adds, so concurrent jobs of one scenario may
overshoot a limit by the calls they have in flight (``tests/learning/test_learning_budget.py``).

A meter made for a scenario also adds each call and each training minute to the
process's ``LEARNING_SPEND``, which ``/metrics`` shows as ``reef_learning_*`` counters by
scenario and purpose.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from reef.config.spend import LearningBudgetLimit, PriceConfig
from reef.core.errors import ReefError
from reef.core.prices import Price, cost_of, usage_tokens
from reef.db import Database
from reef.db import schema as t
from reef.experience.spend import window_end, window_start

log = logging.getLogger("reef.experience.learning_spend")

# A ledger row per scope, purpose and window; the columns hold what the kind needs.
_TOKENS_MONEY = "spend"
_CALLS = "calls"


class LearningBudgetExhaustedError(ReefError):
    """A learning budget reached its limit in its window: ``budget`` names it
    (``recipe:r/judge/day``), ``kind`` the limit (calls, tokens, money, cpu_minutes,
    gpu_minutes)."""

    def __init__(
        self, budget: str, kind: str, spent: float, limit: float, resets: datetime
    ) -> None:
        super().__init__(
            f"learning budget {budget} exhausted: {kind} {spent:g} of {limit:g} spent; "
            f"resets {resets.isoformat()}"
        )
        self.budget = budget
        self.kind = kind
        self.spent = spent
        self.limit = limit
        self.resets = resets


@dataclass
class SpendTally:
    """What one job (or one gate decision) spent: model calls, tokens and money by
    purpose, unpriced calls, and training minutes."""

    calls: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    money: dict[str, float] = field(default_factory=dict)
    unpriced: int = 0
    cpu_minutes: float = 0.0
    gpu_minutes: float = 0.0

    def add(self, purpose: str, tokens: int, money: float | None) -> None:
        """Count one call."""
        self.calls[purpose] = self.calls.get(purpose, 0) + 1
        self.tokens[purpose] = self.tokens.get(purpose, 0) + tokens
        if money is None:
            self.unpriced += 1
        else:
            self.money[purpose] = self.money.get(purpose, 0.0) + money

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form: totals, then by purpose (a job's ``cost``)."""
        return {
            "model_calls": sum(self.calls.values()),
            "tokens": sum(self.tokens.values()),
            "money": round(sum(self.money.values()), 6) if self.money else None,
            "unpriced_calls": self.unpriced,
            "cpu_minutes": round(self.cpu_minutes, 3),
            "gpu_minutes": round(self.gpu_minutes, 3),
            "by_purpose": {
                purpose: {
                    "calls": calls,
                    "tokens": self.tokens.get(purpose, 0),
                    "money": self.money.get(purpose),
                }
                for purpose, calls in sorted(self.calls.items())
            },
        }


class LearningSpendCounts:
    """What the learning meters of this process counted since it started, per scenario
    and purpose (calls, tokens, money, unpriced calls) and per scenario and device
    (training minutes): ``/metrics``' ``reef_learning_*`` counters
    (``reef.gateway.budgets.SpendCollector``). Thread-safe: jobs run on worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._published: Path | None = None
        self.calls: dict[tuple[str, str], int] = {}
        self.tokens: dict[tuple[str, str], int] = {}
        self.money: dict[tuple[str, str], float] = {}
        self.unpriced: dict[tuple[str, str], int] = {}
        self.minutes: dict[tuple[str, str], float] = {}

    def add(self, scenario: str, purpose: str, tokens: int, money: float | None) -> None:
        """Count one call of ``purpose`` for ``scenario``."""
        key = (scenario, purpose)
        with self._lock:
            self.calls[key] = self.calls.get(key, 0) + 1
            self.tokens[key] = self.tokens.get(key, 0) + tokens
            if money is None:
                self.unpriced[key] = self.unpriced.get(key, 0) + 1
            else:
                self.money[key] = self.money.get(key, 0.0) + money
            self._publish()

    def add_minutes(self, scenario: str, device: str, minutes: float) -> None:
        """Count ``minutes`` of training on ``device`` (cpu or gpu) for ``scenario``."""
        key = (scenario, device)
        with self._lock:
            self.minutes[key] = self.minutes.get(key, 0.0) + minutes
            self._publish()

    def snapshot(self) -> dict[str, dict[tuple[str, str], float]]:
        """A copy of every count, by kind (``calls``, ``tokens``, ``money``, ``unpriced``,
        ``minutes``)."""
        with self._lock:
            return self._copy()

    def _copy(self) -> dict[str, dict[tuple[str, str], float]]:
        return {
            "calls": dict(self.calls),
            "tokens": dict(self.tokens),
            "money": dict(self.money),
            "unpriced": dict(self.unpriced),
            "minutes": dict(self.minutes),
        }

    def publish_to(self, path: Path | None) -> None:
        """Write the counts to ``path`` now and after every change (None: stop), for
        other processes' ``/metrics`` to read (``read_published``): ``reef serve
        --workers N`` runs the learning worker in the parent, the children answer."""
        with self._lock:
            self._published = path
            self._publish()

    def _publish(self) -> None:
        """The counts to the published file, replaced whole (a reader never sees half)."""
        path = self._published
        if path is None:
            return
        rows = [[kind, a, b, value] for kind, counts in self._copy().items()
                for (a, b), value in counts.items()]  # fmt: skip
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            partial.write_bytes(orjson.dumps(rows))
            partial.replace(path)
        except OSError:  # the directory gone (the gateway stopping): nothing to show
            log.warning("could not publish the learning spend to %s", path, exc_info=True)


def read_published(path: Path) -> dict[str, dict[tuple[str, str], float]] | None:
    """Counts another process published (``LearningSpendCounts.publish_to``); None when
    there are none (yet) or they cannot be read."""
    try:
        rows = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    counts: dict[str, dict[tuple[str, str], float]] = {
        kind: {} for kind in ("calls", "tokens", "money", "unpriced", "minutes")
    }
    for kind, a, b, value in rows:
        if kind in counts:
            counts[kind][(str(a), str(b))] = float(value)
    return counts


# The process's counts; a meter made with a scenario adds to them.
LEARNING_SPEND = LearningSpendCounts()
# Where ``reef serve --workers N`` publishes them, in its metrics directory.
LEARNING_SPEND_FILE = "learning_spend.json"


def price_of(prices: Mapping[str, PriceConfig], model: str | None) -> Price | None:
    """``model``'s price in an upstream's table; None when it has none."""
    found = prices.get(model) if model else None
    if found is None or model is None:
        return None
    return Price(model, found.input_per_mtok, found.output_per_mtok, found.cached_input_per_mtok)


class LearningMeter:
    """Counts one job's learning spend and enforces ``budgets`` (``(scope, limits)``
    pairs) on ``database``'s ledger; ``clock`` is the job queue's (module doc)."""

    def __init__(
        self,
        database: Database | None,
        budgets: Sequence[tuple[str, Sequence[LearningBudgetLimit]]],
        clock: Callable[[], datetime],
        scenario: str | None = None,
    ) -> None:
        self.database = database
        self.scenario = scenario  # counted in ``LEARNING_SPEND`` under it when set
        self.of_gate = False  # a gate's meter: budgets of purpose ``gate`` count it too
        self.budgets = [(scope, list(limits)) for scope, limits in budgets if limits]
        self.clock = clock
        self.tally = SpendTally()
        self._tallies = [self.tally]  # this meter's, then its parents'
        # The first refusal, kept even when a caller swallowed the error (a learner
        # that counts a failed model call as one lost variant): see ``refused``.
        self.exhausted: LearningBudgetExhaustedError | None = None
        self._lock = threading.Lock()

    def child(self) -> LearningMeter:
        """A meter on the same budgets with a tally of its own (a gate decision's),
        whose charges count in this one's tally too."""
        child = LearningMeter(self.database, self.budgets, self.clock, self.scenario)
        child.of_gate = self.of_gate
        child._tallies = [child.tally, *self._tallies]
        child._lock = self._lock
        return child

    def gate(self) -> LearningMeter:
        """A child meter (``child``) for a gate's calls: whatever their purpose
        (``eval``, ``episode``, a model-graded scorer's ``judge``), budgets of purpose
        ``gate`` count them too."""
        child = self.child()
        child.of_gate = True
        return child

    def counts(self, purpose: str) -> bool:
        """Whether a budget counts ``purpose`` (else ``admit`` and ``charge`` touch no
        ledger)."""
        return any(
            self._counted(limit.purpose, purpose) for _, limits in self.budgets for limit in limits
        )

    def _counted(self, budget_purpose: str, purpose: str) -> bool:
        """Whether a budget of ``budget_purpose`` counts a call of ``purpose``."""
        return budget_purpose in (purpose, "total") or (self.of_gate and budget_purpose == "gate")

    # -- admission ------------------------------------------------------------------------

    def admit(self, purpose: str) -> None:
        """Raise ``LearningBudgetExhaustedError`` when a budget counting ``purpose`` has
        reached a call, token or money limit in its window."""
        for budget, limit, start in self._lines(purpose):
            calls = self._read(budget, _CALLS, start)[0]
            tokens, money = self._read(budget, _TOKENS_MONEY, start)
            for kind, spent in (("calls", calls), ("tokens", tokens), ("money", money)):
                self._check(budget, limit, start, kind, spent)

    def admit_training(self, device: str) -> None:
        """Raise ``LearningBudgetExhaustedError`` when the ``device`` minutes budget
        (``cpu`` or ``gpu``) has been reached in its window."""
        kind = f"{device}_minutes"
        for budget, limit, start in self._lines("total"):
            if getattr(limit, kind) is not None:
                self._check(budget, limit, start, kind, self._read(budget, kind, start)[1])

    def training_minutes_left(self, device: str) -> float | None:
        """The ``device`` minutes (``cpu`` or ``gpu``) the tightest budget has left in
        its window: the trainer's deadline (None: no budget limits them)."""
        rooms = self._minute_rooms(device)
        return min(room[0] for room in rooms) if rooms else None

    def training_exhausted(self, device: str) -> LearningBudgetExhaustedError:
        """The refusal of the tightest ``device`` minutes budget, for a trainer that
        stopped at its deadline (after its minutes were charged); also kept as this
        meter's first refusal."""
        kind = f"{device}_minutes"
        _, budget, limit, start, spent = min(self._minute_rooms(device), key=lambda r: r[0])
        cap = float(getattr(limit, kind))
        error = LearningBudgetExhaustedError(
            budget, kind, spent, cap, window_end(limit.window, start)
        )
        self.exhausted = self.exhausted or error
        return error

    def _minute_rooms(
        self, device: str
    ) -> list[tuple[float, str, LearningBudgetLimit, datetime, float]]:
        """(minutes left, budget, limit, window start, spent) of each budget limiting
        ``device`` minutes."""
        kind = f"{device}_minutes"
        rooms = []
        for budget, limit, start in self._lines("total"):
            cap = getattr(limit, kind)
            if cap is not None:
                spent = self._read(budget, kind, start)[1]
                rooms.append((cap - spent, budget, limit, start, spent))
        return rooms

    def _check(
        self, budget: str, limit: LearningBudgetLimit, start: datetime, kind: str, spent: float
    ) -> None:
        cap = getattr(limit, kind)
        if cap is not None and spent >= cap:
            error = LearningBudgetExhaustedError(
                budget, kind, spent, cap, window_end(limit.window, start)
            )
            self.exhausted = self.exhausted or error
            raise error

    def refused(self) -> None:
        """Raise the first refusal this meter made, if any (a job checks after its
        learners: what they made without a refused call is half-made)."""
        if self.exhausted is not None:
            raise self.exhausted

    # -- charging -------------------------------------------------------------------------

    def charge(self, purpose: str, usage: Any, price: Price | None) -> None:
        """Count one call of ``purpose`` with its ``usage`` (any API's shape; None:
        unknown) at ``price`` (None: unpriced)."""
        tokens = usage_tokens(usage) if usage else None
        total = 0 if tokens is None else tokens.total
        money = cost_of(usage, price) if usage else None
        with self._lock:
            for tally in self._tallies:
                tally.add(purpose, total, money)
        if self.scenario is not None:
            LEARNING_SPEND.add(self.scenario, purpose, total, money)
        for budget, _, start in self._lines(purpose):
            self._add(budget, _CALLS, start, 1, 0.0)
            self._add(budget, _TOKENS_MONEY, start, total, money or 0.0)

    def charge_training(self, device: str, minutes: float) -> None:
        """Count ``minutes`` of training on ``device`` (``cpu`` or ``gpu``)."""
        with self._lock:
            for tally in self._tallies:
                if device == "gpu":
                    tally.gpu_minutes += minutes
                else:
                    tally.cpu_minutes += minutes
        if self.scenario is not None:
            LEARNING_SPEND.add_minutes(self.scenario, device, minutes)
        for budget, _, start in self._lines("total"):
            self._add(budget, f"{device}_minutes", start, 0, minutes)

    def status(self) -> list[dict[str, Any]]:
        """Each budget in its current window: ``{budget, purpose, window, resets}`` and,
        per kind (calls, tokens, money, cpu_minutes, gpu_minutes), what was spent and
        ``<kind>_limit`` (None: not limited). For ``/reef/status``."""
        now = self.clock()
        rows = []
        for scope, limits in self.budgets:
            for limit in limits:
                budget = f"learn:{scope}/{limit.purpose}/{limit.window}"
                start = window_start(limit.window, now)
                tokens, money = self._read(budget, _TOKENS_MONEY, start)
                spent = {
                    "calls": self._read(budget, _CALLS, start)[0],
                    "tokens": tokens,
                    "money": money,
                    "cpu_minutes": self._read(budget, "cpu_minutes", start)[1],
                    "gpu_minutes": self._read(budget, "gpu_minutes", start)[1],
                }
                row: dict[str, Any] = {
                    "budget": budget,
                    "purpose": limit.purpose,
                    "window": limit.window,
                    "resets": window_end(limit.window, start).isoformat().replace("+00:00", "Z"),
                }
                for kind, value in spent.items():
                    row[kind] = value
                    row[f"{kind}_limit"] = getattr(limit, kind)
                rows.append(row)
        return rows

    # -- the ledger -----------------------------------------------------------------------

    def _lines(self, purpose: str) -> list[tuple[str, LearningBudgetLimit, datetime]]:
        """The budgets counting ``purpose``: (name, limit, window start)."""
        now = self.clock()
        return [
            (
                f"learn:{scope}/{limit.purpose}/{limit.window}",
                limit,
                window_start(limit.window, now),
            )
            for scope, limits in self.budgets
            for limit in limits
            if self._counted(limit.purpose, purpose)
        ]

    def _read(self, budget: str, column: str, start: datetime) -> tuple[int, float]:
        if self.database is None:
            return 0, 0.0
        with self.database.read() as conn:
            row = conn.execute(
                t.spend_windows.select().where(
                    t.spend_windows.c.budget == f"{budget}:{column}",
                    t.spend_windows.c.window_start == start,
                )
            ).first()
        return (0, 0.0) if row is None else (int(row.tokens), float(row.money))

    def _add(self, budget: str, column: str, start: datetime, count: int, amount: float) -> None:
        if self.database is None:
            return
        name = f"{budget}:{column}"
        insert = pg_insert if self.database.dialect == "postgresql" else sqlite_insert
        row = {"budget": name, "window_start": start, "tokens": 0, "money": 0.0}
        columns = t.spend_windows.c
        with self.database.engine.begin() as conn:
            conn.execute(insert(t.spend_windows).values([row]).on_conflict_do_nothing())
            conn.execute(
                update(t.spend_windows)
                .where(columns.budget == name, columns.window_start == start)
                .values(tokens=columns.tokens + count, money=columns.money + amount)
            )

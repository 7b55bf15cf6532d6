"""Serving budgets (402) and rate limits (429), checked before each upstream call.

A request is admitted when every budget it counts against (global, its scenario, its
key) is still below its limit in the current window; it then reserves its estimate
(input bytes / 4 + ``max_tokens``, priced at the model's price) and, when its answer
comes, settles that reservation to its actual usage. Refused when spent: a budget
already at or over its limit, reservations in flight included. So sequential requests
are refused exactly once the window's spend has crossed the limit
(``tests/gateway/test_budgets.py``); concurrent ones may be refused while the
reservations of those in flight fill the rest.

Overshoot bound: admission and reservation are one atomic step (the event loop, in
memory; one transaction of conditional ``UPDATE``s, with ``budgets.ledger: store``,
shared by every gateway on the store). A window's spend therefore ends at most
``limit + R + U``: ``R`` the largest single reservation (the last request admitted
below the limit), ``U`` the sum of the amounts by which answers exceeded their
reservations (none when every request sets ``max_tokens`` and its input estimate
holds). ``tests/gateway/test_budgets_shared.py`` checks it with two gateways on
PostgreSQL and 32 concurrent clients.

Rate limits are token buckets in memory, each replica enforcing ``limit / replicas``
(``rate_limits.replicas``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from reef.config import ReefSettings, ScenarioConfig
from reef.config.spend import BudgetLimit, RateLimit
from reef.core.clock import Clock, utc_now
from reef.core.errors import ReefError
from reef.core.prices import MILLION, Price, Tokens
from reef.db import Database
from reef.experience import (
    LEARNING_SPEND,
    LEARNING_SPEND_FILE,
    Ledger,
    Line,
    MemoryLedger,
    StoreLedger,
    read_published,
    window_end,
    window_start,
)

BYTES_PER_TOKEN = 4  # the input estimate of a reservation: request bytes / 4


class SpendRefusedError(ReefError):
    """A request refused before its upstream call: ``status`` 402 or 429, with the
    seconds until it may be tried again and headers naming what refused it."""

    status = 402

    def __init__(self, message: str, retry_after: float, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.retry_after_seconds = max(1, math.ceil(retry_after))
        self.headers = headers


class BudgetExceededError(SpendRefusedError):
    """A budget of the request's is spent for its window (402)."""

    status = 402


class RateLimitedError(SpendRefusedError):
    """A rate limit of the request's is exhausted for now (429)."""

    status = 429


class Bucket:
    """A token bucket: ``rate`` per second, holding at most a minute's worth."""

    __slots__ = ("capacity", "level", "rate", "stamp")

    def __init__(self, per_minute: float, now: float) -> None:
        self.capacity = per_minute
        self.rate = per_minute / 60.0
        self.level = per_minute
        self.stamp = now

    def refill(self, now: float) -> None:
        """Add what ``now - stamp`` seconds earned (up to the capacity)."""
        if now > self.stamp:
            level = self.level + (now - self.stamp) * self.rate
            self.level = level if level < self.capacity else self.capacity
            self.stamp = now

    def wait(self, needed: float) -> float:
        """Seconds until the level reaches ``needed``."""
        return max(0.0, (needed - self.level) / self.rate)


class Charge:
    """One admitted request's hold on its budgets and buckets, settled once: to its
    usage when the upstream answered with one, to nothing when no upstream call was
    made or it failed (``settle(None)``); never settled (a stream cut short, an answer
    without usage), it stays at the reservation."""

    __slots__ = ("control", "money", "plan", "price", "settled", "tokens")

    def __init__(
        self, control: SpendControl, plan: _Plan, price: Price | None, tokens: int, money: float
    ) -> None:
        self.control = control
        self.plan = plan
        self.price = price
        self.tokens = tokens
        self.money = money
        self.settled = False

    @property
    def lines(self) -> tuple[Line, ...]:
        """The budget lines the reservation is held on."""
        return self.plan.lines

    async def settle(self, used: Tokens | None, cost: float | None = None) -> None:
        """Correct the reservation to ``used`` (None: nothing was used), once; ``cost``
        is what ``used`` cost at the charge's price, when the caller has counted it."""
        if self.settled:
            return
        self.settled = True
        if used is None:
            tokens, money = 0, 0.0
        else:
            tokens = used.input + used.output
            if cost is not None:
                money = cost
            else:
                money = self.price.cost(used) if self.price is not None else 0.0
        pending = self.control.correct(self, tokens, money)
        if pending is not None:
            await pending

    async def settle_counted(self, tokens: int, money: float) -> None:
        """Correct the reservation to ``tokens`` and ``money`` the caller counted (a
        distilled request's two attempts, each at its own upstream's price), once."""
        if self.settled:
            return
        self.settled = True
        pending = self.control.correct(self, tokens, money)
        if pending is not None:
            await pending


@dataclass
class SpendCounts:
    """What ``/metrics`` shows of spend (``SpendCollector``)."""

    cost: dict[tuple[str, str], float] = field(default_factory=dict)
    tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    unpriced: dict[tuple[str, str], int] = field(default_factory=dict)
    refused: dict[tuple[str, str], int] = field(default_factory=dict)


_MAX_PLANS = 10_000  # (scenario, key) pairs remembered; the oldest is made again


class _Plan:
    """What a request of one scenario and key counts against, until ``until`` (a POSIX
    timestamp): its budget lines and, with the ledger in memory, their live counts
    (``cells``: ``[tokens, money]`` lists, with each line's limits, ``inf`` for none);
    its rate-limit buckets, and of those the tokens/min ones."""

    __slots__ = ("buckets", "cells", "empty", "lines", "token_buckets", "until")

    def __init__(
        self,
        lines: tuple[Line, ...],
        cells: tuple[tuple[list[float], float, float], ...] | None,
        until: float,
        buckets: tuple[tuple[Bucket, bool, str], ...],
    ) -> None:
        self.lines = lines
        self.cells = cells
        self.until = until
        self.buckets = buckets
        self.token_buckets = tuple(bucket for bucket, of_tokens, _ in buckets if of_tokens)
        self.empty = not lines and not buckets


class SpendControl:
    """Budgets and rate limits of one gateway (``GatewayState.spend``)."""

    def __init__(self, settings: ReefSettings, ledger: Ledger, clock: Clock) -> None:
        self.settings = settings
        self.ledger = ledger
        self.clock = clock
        self.budgets = settings.budgets
        self.limits = settings.rate_limits
        self.enabled = self.budgets.any or self.limits.any
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._plans: dict[tuple[str, str | None], _Plan] = {}
        self._prices: dict[tuple[str, str | None, str | None, bool], Price | None] = {}
        self.counts = SpendCounts()

    def price_for(
        self, scenario: str, base_model: str | None, requested: Any, from_client: bool
    ) -> Price | None:
        """The price of the model a request of ``scenario`` goes upstream as: the
        configured one (``configured_model``), or the client's (``from_client``).
        Remembered per scenario and model names (a request pays one lookup)."""
        named = requested if isinstance(requested, str) else None
        slot = (scenario, base_model, named, from_client)
        if slot in self._prices:
            return self._prices[slot]
        prices = self.settings.upstream_for(scenario)[1].prices
        model = named if from_client else configured_model(self.settings, scenario, base_model)
        model = model or named
        found = prices.get(model) if model else None
        price = None
        if found is not None and model:
            price = Price(
                model, found.input_per_mtok, found.output_per_mtok, found.cached_input_per_mtok
            )
        if len(self._prices) >= _MAX_PLANS:
            self._prices.pop(next(iter(self._prices)))
        self._prices[slot] = price
        return price

    def price_at(self, upstream: str, model: str) -> Price | None:
        """The price of ``model`` on ``upstream`` (``upstreams.<u>.prices``), or None."""
        found = self.settings.upstreams[upstream].prices.get(model)
        if found is None:
            return None
        input_price, cached = found.input_per_mtok, found.cached_input_per_mtok
        return Price(model, input_price, found.output_per_mtok, cached)

    def _plan(self, scenario: str, key_id: str | None, now: datetime) -> _Plan:
        """The budget lines and buckets of a request of ``scenario`` by ``key_id``,
        made once per window (the hot path reuses it until its earliest window ends)."""
        budgets = self.budgets
        named: list[tuple[str, list[BudgetLimit]]] = [("global", budgets.global_)]
        named.append((f"scenario:{scenario}", budgets.scenarios.get(scenario, [])))
        if key_id is not None:
            named.append((f"key:{key_id}", budgets.keys.get(key_id, [])))
        lines = tuple(
            Line(budget, limit, window_start(limit.window, now))
            for budget, limits in named
            for limit in limits
        )
        until = min((window_end(line.limit.window, line.start) for line in lines), default=None)
        cells = None
        if isinstance(self.ledger, MemoryLedger):
            cells = tuple(
                (count, _or_inf(line.limit.tokens), _or_inf(line.limit.money))
                for line, count in zip(lines, self.ledger.counts(lines), strict=True)
            )
        limits: list[tuple[str, RateLimit]] = []
        scenario_limit = self.limits.scenarios.get(scenario)
        if scenario_limit is not None:
            limits.append((f"scenario:{scenario}", scenario_limit))
        key_limit = self.limits.keys.get(key_id) if key_id is not None else None
        if key_limit is not None:
            limits.append((f"key:{key_id}", key_limit))
        stamp = now.timestamp()
        buckets: list[tuple[Bucket, bool, str]] = []
        for name, limit in limits:
            if limit.requests_per_minute is not None:
                bucket = self._bucket(name, "requests", limit.requests_per_minute, stamp)
                buckets.append((bucket, False, f"{name}/requests_per_minute"))
            if limit.tokens_per_minute is not None:
                bucket = self._bucket(name, "tokens", limit.tokens_per_minute, stamp)
                buckets.append((bucket, True, f"{name}/tokens_per_minute"))
        ends = until.timestamp() if until is not None else math.inf
        plan = self._plans[(scenario, key_id)] = _Plan(lines, cells, ends, tuple(buckets))
        if len(self._plans) > _MAX_PLANS:
            self._plans.pop(next(iter(self._plans)))
        return plan

    def lines(self, scenario: str, key_id: str | None, now: datetime) -> tuple[Line, ...]:
        """The budgets a request of ``scenario`` by ``key_id`` counts against."""
        plan = self._plans.get((scenario, key_id))
        if plan is None or now.timestamp() >= plan.until:
            plan = self._plan(scenario, key_id, now)
        return plan.lines

    async def admit(
        self,
        scenario: str,
        key_id: str | None,
        estimate: tuple[int, int],
        price: Price | None,
    ) -> Charge | None:
        """Take a request's reservation of ``estimate`` (input and output tokens,
        ``request_estimate``), or raise ``RateLimitedError`` (429) or
        ``BudgetExceededError`` (402). None when no budget or rate limit applies to it
        (nothing to settle).

        With the ledger in memory this never suspends: the plan holds the live counts
        of its windows, checked and added to in place."""
        now: datetime | None = None
        if self.clock is utc_now:  # the wall clock as a number; a datetime only if needed
            stamp = time.time()
        else:
            now = self.clock()
            stamp = now.timestamp()
        plan = self._plans.get((scenario, key_id))
        if plan is None or stamp >= plan.until:
            plan = self._plan(scenario, key_id, now or _utc(stamp))
        if plan.empty:
            return None
        input_tokens, output_tokens = estimate
        tokens = input_tokens + output_tokens
        if plan.buckets:
            self._take(plan.buckets, tokens, stamp)
        money = 0.0
        if price is not None:
            money = (
                input_tokens * price.input_per_mtok + output_tokens * price.output_per_mtok
            ) / MILLION
        if plan.lines:
            if plan.cells is not None:
                refused = _reserve_in_place(plan, tokens, money)
            else:
                refused = await self.ledger.reserve(plan.lines, tokens, money)
            if refused is not None:
                self._give_back(plan.buckets, tokens)
                raise await self._budget_refusal(refused, now or _utc(stamp))
        return Charge(self, plan, price, tokens, money)

    def _take(self, buckets: tuple[tuple[Bucket, bool, str], ...], tokens: int, now: float) -> None:
        """Take one request, or ``tokens``, from each bucket; ``RateLimitedError`` when
        one lacks it (a tokens/min bucket may go into debt: any request is admitted
        while some tokens remain), and then none is taken from."""
        for bucket, of_tokens, what in buckets:
            bucket.refill(now)
            needed = 1e-9 if of_tokens else 1.0
            if bucket.level < needed:
                self._refused(what.split("/")[0], "rate")
                raise RateLimitedError(
                    f"rate limit {what.replace('/', ' ')} "
                    f"({bucket.capacity * self.limits.replicas:g}/min) is exhausted; "
                    "try again later",
                    bucket.wait(needed),
                    {"x-reef-rate-limit": what},
                )
        for bucket, of_tokens, _ in buckets:
            bucket.level -= tokens if of_tokens else 1.0

    def _bucket(self, name: str, kind: str, per_minute: int, now: float) -> Bucket:
        bucket = self._buckets.get((name, kind))
        if bucket is None:
            share = per_minute / self.limits.replicas
            bucket = self._buckets[(name, kind)] = Bucket(share, now)
        return bucket

    @staticmethod
    def _give_back(buckets: tuple[tuple[Bucket, bool, str], ...], tokens: int) -> None:
        for bucket, of_tokens, _ in buckets:
            bucket.level = min(bucket.capacity, bucket.level + (tokens if of_tokens else 1.0))

    async def _budget_refusal(self, line: Line, now: datetime) -> BudgetExceededError:
        tokens, money = await self.ledger.spent(line)
        limit = line.limit
        resets = window_end(limit.window, line.start)
        parts = []
        if limit.money is not None:
            parts.append(f"money {money:.6g} of {limit.money:g}")
        if limit.tokens is not None:
            parts.append(f"tokens {tokens} of {limit.tokens}")
        self._refused(line.budget, limit.window)
        return BudgetExceededError(
            f"budget {line.budget} ({limit.window}) is spent: {', '.join(parts)}; "
            f"it resets at {resets.isoformat().replace('+00:00', 'Z')}",
            (resets - now).total_seconds(),
            {
                "x-reef-budget": f"{line.budget}/{limit.window}",
                "x-reef-budget-reset": resets.isoformat().replace("+00:00", "Z"),
            },
        )

    def _refused(self, what: str, window: str) -> None:
        refused = self.counts.refused
        refused[(what, window)] = refused.get((what, window), 0) + 1

    def correct(
        self, charge: Charge, tokens: int, money: float
    ) -> Coroutine[Any, Any, None] | None:
        """Correct ``charge``'s reservation to ``tokens`` and ``money``: in place with the
        ledger in memory (the counts of the windows it was admitted in; None returned),
        else the ledger's ``settle``, for the caller to await."""
        delta_tokens = tokens - charge.tokens
        plan = charge.plan
        for bucket in plan.token_buckets:  # tokens/min buckets: the estimate corrected
            level = bucket.level - delta_tokens
            bucket.level = level if level < bucket.capacity else bucket.capacity
        delta_money = money - charge.money
        if not plan.lines or not (delta_tokens or delta_money):
            return None
        if plan.cells is None:
            return self.ledger.settle(plan.lines, delta_tokens, delta_money)
        for count, _, _ in plan.cells:
            count[0] += delta_tokens
            count[1] += delta_money
        return None

    async def status_json(self) -> dict[str, Any]:
        """``/reef/status``'s ``spend``: each budget's spend in its current window, what
        this process served per scenario and purpose since it started, and the requests
        it refused per budget or rate limit (``window`` ``rate`` for a rate limit)."""
        now = self.clock()
        named: list[tuple[str, list[BudgetLimit]]] = [("global", self.budgets.global_)]
        named += [(f"scenario:{s}", limits) for s, limits in self.budgets.scenarios.items()]
        named += [(f"key:{k}", limits) for k, limits in self.budgets.keys.items()]
        budgets = []
        for budget, limits in named:
            for limit in limits:
                line = Line(budget, limit, window_start(limit.window, now))
                tokens, money = await self.ledger.spent(line)
                resets = window_end(limit.window, line.start)
                budgets.append(
                    {
                        "budget": budget,
                        "window": limit.window,
                        "tokens_limit": limit.tokens,
                        "money_limit": limit.money,
                        "tokens": tokens,
                        "money": money,
                        "resets": resets.isoformat().replace("+00:00", "Z"),
                    }
                )
        counts = self.counts
        keys = sorted(set(counts.cost) | set(counts.tokens) | set(counts.unpriced))
        served = [
            {
                "scenario": scenario,
                "purpose": purpose,
                "cost": counts.cost.get((scenario, purpose), 0.0),
                "tokens": counts.tokens.get((scenario, purpose), 0),
                "unpriced": counts.unpriced.get((scenario, purpose), 0),
            }
            for scenario, purpose in keys
        ]
        refused = [
            {"limit": what, "window": window, "count": n}
            for (what, window), n in sorted(counts.refused.items())
        ]
        return {"budgets": budgets, "served": served, "refused": refused}

    def count(self, scenario: str, purpose: str, tokens: Tokens | None, cost: float | None) -> None:
        """Count one exchange's spend for ``/metrics``."""
        key = (scenario, purpose)
        counts = self.counts
        if tokens is not None:
            counts.tokens[key] = counts.tokens.get(key, 0) + tokens.total
        if cost is None:
            counts.unpriced[key] = counts.unpriced.get(key, 0) + 1
        else:
            counts.cost[key] = counts.cost.get(key, 0.0) + cost


def request_estimate(
    body: bytes, fields: dict[str, Any], default_max_tokens: int
) -> tuple[int, int]:
    """A request's reservation, input and output tokens: its bytes / 4 as input, its
    ``max_tokens`` (or ``max_completion_tokens``, ``max_output_tokens``; else
    ``default_max_tokens``) as output."""
    output = default_max_tokens
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = fields.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            output = value
            break
    return len(body) // BYTES_PER_TOKEN + 1, output


def _reserve_in_place(plan: _Plan, tokens: int, money: float) -> Line | None:
    """``MemoryLedger.reserve`` on the plan's live counts: the first line already spent,
    or None and the reservation added to every line."""
    cells = plan.cells or ()
    for index, (count, tokens_limit, money_limit) in enumerate(cells):
        if count[0] >= tokens_limit or count[1] >= money_limit:
            return plan.lines[index]
    for count, _, _ in cells:
        count[0] += tokens
        count[1] += money
    return None


def _utc(stamp: float) -> datetime:
    return datetime.fromtimestamp(stamp, UTC)


def _or_inf(limit: float | None) -> float:
    return math.inf if limit is None else limit


def configured_model(settings: ReefSettings, scenario: str, base_model: str | None) -> str | None:
    """The model a scenario's requests go upstream as, when one is configured."""
    config: ScenarioConfig = settings.scenario(scenario)
    return config.model or base_model or settings.upstream_for(scenario)[1].model


def open_ledger(settings: ReefSettings, database: Database) -> Ledger:
    """The ledger ``budgets.ledger`` asks for (``auto``: the store on PostgreSQL)."""
    choice = settings.budgets.ledger
    if choice == "auto":
        choice = "store" if database.dialect == "postgresql" else "memory"
    return StoreLedger(database) if choice == "store" else MemoryLedger()


class SpendCollector(Collector):
    """Spend counters for ``/metrics``, read at scrape time."""

    def __init__(self, control: SpendControl) -> None:
        self._control = control

    def collect(self) -> Iterator[CounterMetricFamily]:
        counts = self._control.counts
        for name, doc, values in (
            ("reef_spend_cost", "Money spent on upstream calls.", counts.cost),
            ("reef_spend_tokens", "Tokens used by upstream calls.", counts.tokens),
            ("reef_spend_unpriced", "Exchanges of a model with no price.", counts.unpriced),
        ):
            family = CounterMetricFamily(name, doc, labels=["scenario", "purpose"])
            for (scenario, purpose), value in sorted(values.items()):
                family.add_metric([scenario, purpose], value)
            yield family
        refused = CounterMetricFamily(
            "reef_spend_refused",
            "Requests refused by a budget (402) or a rate limit (429).",
            labels=["limit", "window"],
        )
        for (what, window), value in sorted(counts.refused.items()):
            refused.add_metric([what, window], value)
        yield refused
        yield from learning_families()


def learning_families() -> Iterator[CounterMetricFamily]:
    """Reef's own learning spend counted in this process (``LEARNING_SPEND``), or, in a
    gateway process of ``reef serve --workers N``, what the parent (which runs the
    learning worker) published in the metrics directory."""
    shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    published = read_published(Path(shared) / LEARNING_SPEND_FILE) if shared else None
    counts = LEARNING_SPEND.snapshot() if published is None else published
    for name, doc, kind in (
        ("reef_learning_calls", "Model calls of Reef's own learning.", "calls"),
        ("reef_learning_tokens", "Tokens used by Reef's own learning calls.", "tokens"),
        ("reef_learning_cost", "Money spent by Reef's own learning calls.", "money"),
        ("reef_learning_unpriced", "Learning calls of a model with no price.", "unpriced"),
    ):
        family = CounterMetricFamily(name, doc, labels=["scenario", "purpose"])
        for (scenario, purpose), value in sorted(counts[kind].items()):
            family.add_metric([scenario, purpose], value)
        yield family
    minutes = CounterMetricFamily(
        "reef_learning_training_minutes",
        "Training minutes of Reef's own learning, by device (cpu, gpu).",
        labels=["scenario", "device"],
    )
    for (scenario, device), value in sorted(counts["minutes"].items()):
        minutes.add_metric([scenario, device], value)
    yield minutes

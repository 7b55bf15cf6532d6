"""The spend sections: model prices, serving budgets and rate limits (``docs/costs.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from reef.config.models import ReefSettings

Window = Literal["hour", "day", "month"]
WINDOW_ORDER: dict[Window, int] = {"hour": 0, "day": 1, "month": 2}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PriceConfig(_Section):
    """What one model costs, in money units (USD unless you mean otherwise) per million
    tokens. Reef never guesses a price: a model without one is served and counted as
    unpriced."""

    input_per_mtok: float = Field(ge=0, description="Price of a million input tokens.")
    output_per_mtok: float = Field(ge=0, description="Price of a million output tokens.")
    cached_input_per_mtok: float | None = Field(
        default=None,
        ge=0,
        description="Price of a million input tokens read from the upstream's prompt cache. "
        "Default: the input price.",
    )


class BudgetLimit(_Section):
    """One budget: a window and its limits (tokens and/or money)."""

    window: Window = Field(description="Calendar window in UTC: hour, day or month.")
    tokens: int | None = Field(default=None, gt=0, description="Most tokens per window.")
    money: float | None = Field(default=None, gt=0, description="Most money per window.")

    @model_validator(mode="after")
    def _limits_something(self) -> BudgetLimit:
        if self.tokens is None and self.money is None:
            raise ValueError(f"a {self.window} budget needs tokens, money or both")
        return self


class BudgetsConfig(_Section):
    """Serving budgets at three levels; over any of them inference is answered 402."""

    ledger: Literal["auto", "memory", "store"] = Field(
        default="auto",
        description="Where spend is counted: `memory` (this process; a restart starts the "
        "windows afresh), `store` (one atomic update per request in the store, shared by "
        "every gateway on it), `auto`: `store` on PostgreSQL, else `memory`.",
    )
    default_max_tokens: int = Field(
        default=4096,
        gt=0,
        description="Output tokens reserved for a request that sets no max_tokens.",
    )
    global_: list[BudgetLimit] = Field(
        default_factory=list, alias="global", description="Budgets of all traffic together."
    )
    scenarios: dict[str, list[BudgetLimit]] = Field(
        default_factory=dict, description="Budgets per scenario."
    )
    keys: dict[str, list[BudgetLimit]] = Field(
        default_factory=dict, description="Budgets per API key id."
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self) -> BudgetsConfig:
        check_limits("budgets.global", self.global_)
        for name, limits in self.scenarios.items():
            check_limits(f"budgets.scenarios.{name}", limits)
        for name, limits in self.keys.items():
            check_limits(f"budgets.keys.{name}", limits)
        return self

    @property
    def any(self) -> bool:
        """Whether any budget is set."""
        return bool(self.global_ or self.scenarios or self.keys)


def check_limits(where: str, limits: list[BudgetLimit]) -> None:
    """``ValueError`` naming ``where`` when two budgets share a window, or a shorter
    window allows more than a longer one (it could never bind: a contradiction)."""
    seen: dict[str, BudgetLimit] = {}
    for limit in limits:
        if limit.window in seen:
            raise ValueError(f"{where}: two budgets for the window {limit.window!r}")
        seen[limit.window] = limit
    ordered = sorted(limits, key=lambda limit: WINDOW_ORDER[limit.window])
    for short in ordered:
        for long in ordered:
            if WINDOW_ORDER[short.window] >= WINDOW_ORDER[long.window]:
                continue
            for kind in ("tokens", "money"):
                small, large = getattr(short, kind), getattr(long, kind)
                if small is not None and large is not None and small > large:
                    raise ValueError(
                        f"{where}: the {short.window} {kind} budget ({small}) exceeds the "
                        f"{long.window} one ({large}); a {short.window} cannot spend more "
                        f"than its {long.window}"
                    )


class RateLimit(_Section):
    """Requests and tokens per minute, as a token bucket (a minute's worth of burst)."""

    requests_per_minute: int | None = Field(default=None, gt=0, description="Requests/min.")
    tokens_per_minute: int | None = Field(
        default=None,
        gt=0,
        description="Tokens/min: a request's estimate (input + max_tokens) is taken when it "
        "starts and corrected by its usage when it ends.",
    )

    @model_validator(mode="after")
    def _limits_something(self) -> RateLimit:
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ValueError("a rate limit needs requests_per_minute, tokens_per_minute or both")
        return self


class RateLimitsConfig(_Section):
    """Rate limits per key and per scenario; over one, inference is answered 429."""

    replicas: int = Field(
        default=1,
        gt=0,
        description="Gateway replicas sharing these limits: each enforces its share "
        "(limit / replicas) in memory, so a load balancer that spreads requests evenly "
        "keeps the total within the limit.",
    )
    keys: dict[str, RateLimit] = Field(default_factory=dict, description="Per API key id.")
    scenarios: dict[str, RateLimit] = Field(default_factory=dict, description="Per scenario.")

    @property
    def any(self) -> bool:
        """Whether any limit is set."""
        return bool(self.keys or self.scenarios)


def check_spend(settings: ReefSettings) -> None:
    """``ValueError`` naming the field for a budget or limit of a key that is not
    configured, of a scenario the gateway rejects, or a price for a model an upstream
    with a fixed model never serves."""
    ids = {key.id for key in settings.auth.keys}
    for where, names in (
        ("budgets.keys", settings.budgets.keys),
        ("rate_limits.keys", settings.rate_limits.keys),
    ):
        unknown = sorted(set(names) - ids)
        if unknown:
            raise ValueError(
                f"{where}: unknown api key id(s) {unknown}; configured keys: {sorted(ids)}"
            )
    if settings.server.unknown_scenarios == "reject":
        for where, names in (
            ("budgets.scenarios", settings.budgets.scenarios),
            ("rate_limits.scenarios", settings.rate_limits.scenarios),
        ):
            unknown = sorted(set(names) - set(settings.scenarios))
            if unknown:
                raise ValueError(
                    f"{where}: unknown scenario(s) {unknown} (server.unknown_scenarios is "
                    f"reject); configured scenarios: {sorted(settings.scenarios)}"
                )
    for name, upstream in settings.upstreams.items():
        if upstream.model is None or not upstream.prices:
            continue  # client model names pass through: any model may be priced
        served = (
            {upstream.model}
            | {
                scenario.model
                for scenario in settings.scenarios.values()
                if scenario.model and (scenario.upstream or next(iter(settings.upstreams))) == name
            }
            | {  # a distilled scenario's teacher is asked by its own model name
                scenario.distill.teacher.model
                for scenario in settings.scenarios.values()
                if scenario.distill is not None and scenario.distill.teacher.upstream == name
            }
        )
        unknown = sorted(set(upstream.prices) - served)
        if unknown:
            raise ValueError(
                f"upstreams.{name}.prices: unknown model(s) {unknown}; upstream {name!r} "
                f"serves {sorted(served)}"
            )


LearningPurpose = Literal[
    "total", "judge", "reflect", "eval", "episode", "teacher", "shadow", "gate"
]


class LearningBudgetLimit(_Section):
    """One budget of Reef's own learning spend in one window: model calls, tokens and
    money of one ``purpose`` (``total``: every purpose together), and training time in
    CPU and GPU minutes (``total`` only). ``tests/learning/test_learning_budget.py``."""

    window: Window = Field(description="Calendar window in UTC: hour, day or month.")
    purpose: LearningPurpose = Field(
        default="total",
        description="Whose calls count: judge (judges, the signal extractor, the gate's "
        "model-graded scorers), reflect (reflective learners), eval (the gate's answers "
        "through the gateway), episode (the turns of the gate's episodes), teacher (the "
        "teacher model's calls in distillation), shadow (the evaluating candidate's answers "
        "to sampled live requests, gate.shadow), gate (every call the gate makes: its eval "
        "answers, episode turns and model-graded scorers' judge calls), or total (all of "
        "them, and training time).",
    )
    calls: int | None = Field(default=None, gt=0, description="Most model calls per window.")
    tokens: int | None = Field(default=None, gt=0, description="Most tokens per window.")
    money: float | None = Field(default=None, gt=0, description="Most money per window.")
    cpu_minutes: float | None = Field(
        default=None, gt=0, description="Most training minutes on CPU per window."
    )
    gpu_minutes: float | None = Field(
        default=None, gt=0, description="Most training minutes on GPU per window."
    )

    @model_validator(mode="after")
    def _limits_something(self) -> LearningBudgetLimit:
        kinds = ("calls", "tokens", "money", "cpu_minutes", "gpu_minutes")
        if all(getattr(self, kind) is None for kind in kinds):
            raise ValueError(
                f"a {self.window} learning budget of purpose {self.purpose} needs calls, "
                "tokens, money, cpu_minutes or gpu_minutes"
            )
        minutes = self.cpu_minutes is not None or self.gpu_minutes is not None
        if minutes and self.purpose != "total":
            raise ValueError(
                f"training minutes are a budget of purpose total, not {self.purpose} "
                "(training is no model call)"
            )
        return self


LEARNING_KINDS = ("calls", "tokens", "money", "cpu_minutes", "gpu_minutes")


def check_learning_limits(where: str, limits: list[LearningBudgetLimit]) -> None:
    """``ValueError`` naming ``where`` when two budgets share a purpose and window, or a
    shorter window allows more than a longer one of the same purpose."""
    seen: set[tuple[str, str]] = set()
    for limit in limits:
        slot = (limit.purpose, limit.window)
        if slot in seen:
            raise ValueError(
                f"{where}: two {limit.purpose} learning budgets for the window {limit.window!r}"
            )
        seen.add(slot)
    for short in limits:
        for long in limits:
            if short.purpose != long.purpose:
                continue
            if WINDOW_ORDER[short.window] >= WINDOW_ORDER[long.window]:
                continue
            for kind in LEARNING_KINDS:
                small, large = getattr(short, kind), getattr(long, kind)
                if small is not None and large is not None and small > large:
                    raise ValueError(
                        f"{where}: the {short.window} {short.purpose} {kind} budget ({small}) "
                        f"exceeds the {long.window} one ({large})"
                    )

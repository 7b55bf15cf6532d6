"""The spend page in headless Chromium against a gateway with prices, budgets and a rate
limit: priced and unpriced traffic from two keys, a 402 from a key's budget and a 429
from a scenario's rate limit. The page shows the figures the records carry (per
scenario, key, purpose and release), each budget's use, limit and reset, the unpriced
requests and the refusals, and each learning job's cost with its gate decision's; a key
limited to one scenario sees only that one's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from reef.config.spend import LearningBudgetLimit
from reef.core.prices import Price
from reef.experience import LearningMeter
from tests.dashboard.browser import DashboardPage
from tests.dashboard.world import DashboardWorld
from tests.fakes.clock import FakeClock
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.test_costs_route import KEYS, _upstreams

BUDGETS = {
    "global": [{"window": "day", "money": 100000}],
    "scenarios": {"support": [{"window": "month", "money": 1000}]},
    "keys": {
        "app": [{"window": "day", "tokens": 100000}],
        "root": [{"window": "day", "tokens": 5}],
    },
}
ASK = {"model": "reef/support", "max_tokens": 20}
LEARNING_RECIPE = {"window": "month", "purpose": "total", "money": 2.0, "cpu_minutes": 30}


@dataclass
class Spent:
    """The gateway and the cost of each support record, by key."""

    gateway: GatewayThread
    costs: dict[str, list[float]] = field(default_factory=dict)
    release: str = ""
    jobs: dict[str, str] = field(default_factory=dict)  # scenario -> its learning job


def _tally(calls: int, money: float | None, unpriced: int, cpu: float = 0.0) -> dict[str, Any]:
    return {
        "model_calls": calls,
        "tokens": 10 * calls,
        "money": money,
        "unpriced_calls": unpriced,
        "cpu_minutes": cpu,
        "gpu_minutes": 0.0,
        "by_purpose": {},
    }


# A job that trained and was gated, and one whose judge budget ran out.
SUPPORT_JOB = {
    "outcome": "proposed",
    "cost": _tally(12, 0.5, 2, cpu=3.5),
    "gate": {"action": "published", "cost": {"spend": _tally(4, None, 4)}},
}
CLAUDE_JOB = {"outcome": "budget_exhausted", "cost": _tally(10, None, 10)}


def _finish_job(gateway: GatewayThread, scenario: str, result: dict[str, Any]) -> str:
    """A learning job of ``scenario`` run to its end in the gateway's queue."""
    queue = gateway.app.state.reef.jobs
    job = queue.enqueue(scenario, "learn", {})
    claimed = queue.claim("test-worker", 60.0)
    assert claimed is not None and claimed.id == job.id
    queue.complete(job.id, "test-worker", result)
    return str(job.id)


def _ask(spent: Spent, key: str, text: str) -> None:
    client = spent.gateway.openai(api_key=f"{key}-secret")
    raw = client.chat.completions.with_raw_response.create(
        **ASK, messages=[{"role": "user", "content": text}]
    )
    record = spent.gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.cost is not None and record.release_id is not None
    spent.costs.setdefault(key, []).append(record.cost)
    spent.release = record.release_id


@pytest.fixture
def spent(world: DashboardWorld, tmp_path: Path) -> Iterator[Spent]:
    # ``world`` first, though unused: the package's shared gateway runs the gate
    # (asyncio.run) when built, which cannot start once Playwright holds this thread's loop.
    recipe = tmp_path / "triage.yaml"
    recipe.write_text(
        "learners: [{type: fewshot}]\n"
        "learning_budget: [{window: month, purpose: total, money: 2.0, cpu_minutes: 30}]\n"
    )
    with FakeUpstreamThread() as fake:
        settings = make_settings(
            tmp_path,
            fake.base_url,
            upstreams=_upstreams(fake.base_url),  # claude's model has no price
            auth={"keys": KEYS},
            budgets=BUDGETS,
            rate_limits={"scenarios": {"claude": {"requests_per_minute": 2}}},
            scenarios={
                "support": {
                    "upstream": "fake",
                    "recipe": str(recipe),
                    "learning_budget": [{"window": "day", "purpose": "judge", "calls": 10}],
                },
                "claude": {"upstream": "claude"},
            },
        )
        with GatewayThread(settings) as gateway:
            gateway.app.state.reef.spend.clock = FakeClock()  # the rate limit never refills
            made = Spent(gateway)
            for i in range(3):
                _ask(made, "app", f"support question {i} " + "word " * i)
            _ask(made, "root", "the root key asks once")
            with pytest.raises(openai.APIStatusError) as refused:
                _ask(made, "root", "and is over its day's 5 tokens")
            assert refused.value.status_code == 402
            claude = gateway.anthropic(api_key="app-secret")
            ask = {"model": "reef/claude", "max_tokens": 20}
            for i in range(2):
                claude.messages.create(**ask, messages=[{"role": "user", "content": f"c{i}"}])
            with pytest.raises(anthropic.RateLimitError):
                claude.messages.create(**ask, messages=[{"role": "user", "content": "more"}])
            # Reef's own calls and training, counted on support's learning budgets
            budgets = [
                ("scenario:support", settings.scenario("support").learning_budget),
                ("recipe:triage", [LearningBudgetLimit.model_validate(LEARNING_RECIPE)]),
            ]
            meter = LearningMeter(gateway.database, budgets, gateway.app.state.reef.spend.clock)
            price = Price("m", input_per_mtok=1e5, output_per_mtok=1e5)  # 0.1 per token
            for _ in range(3):
                meter.charge("judge", {"prompt_tokens": 1, "completion_tokens": 1}, price)
            meter.charge_training("cpu", 1.5)
            made.jobs["support"] = _finish_job(gateway, "support", SUPPORT_JOB)
            made.jobs["claude"] = _finish_job(gateway, "claude", CLAUDE_JOB)
            yield made


def _rows(tab: DashboardPage, panel: str) -> list[list[str]]:
    """Each body row of the table in ``panel``: its cells' text."""
    found = tab.page.eval_on_selector_all(
        f"{panel} tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    return [[str(cell) for cell in row] for row in found]


def _open(browser: Any, spent: Spent, tmp_path: Path, key: str) -> tuple[Any, DashboardPage]:
    context = browser.new_context(viewport={"width": 1280, "height": 1400}, timezone_id="UTC")
    tab = DashboardPage(context.new_page(), spent.gateway.url, tmp_path)
    tab.open("#/spend", "auth")
    tab.sign_in(key)
    tab.wait("#/spend")
    return context, tab


def _money(value: float) -> str:
    return f"{value:.4f}"


def test_the_spend_page_shows_what_the_records_cost(
    spent: Spent, browser: Any, tmp_path: Path
) -> None:
    context, tab = _open(browser, spent, tmp_path, "root-secret")
    app, root = sum(spent.costs["app"]), sum(spent.costs["root"])
    assert app > 0 and root > 0
    support = app + root
    assert tab.text("#total-cost") == _money(support)
    assert tab.text("#total-requests") == "6"  # 4 support, 2 claude; refusals not recorded
    assert tab.text("#total-unpriced") == "2"
    # per scenario: Scenario, Requests, Unpriced, Input, Cached, Output, Cost
    by_scenario = _rows(tab, "#by-scenario")
    assert [(r[0], r[1], r[2], r[6]) for r in by_scenario] == [
        ("support", "4", "0", _money(support)),
        ("claude", "2", "2", _money(0)),
    ]
    assert int(by_scenario[1][3]) > 0  # unpriced, its tokens still counted
    by_key = [(r[0], r[1], r[6]) for r in _rows(tab, "#by-key")]
    assert sorted(by_key) == sorted([("app", "5", _money(app)), ("root", "1", _money(root))])
    assert [(r[0], r[1], r[6]) for r in _rows(tab, "#by-purpose")] == [
        ("serve", "6", _money(support))
    ]
    # per release: the support release first (costliest), its short id shown
    release = _rows(tab, "#by-release")[0]
    assert release[0] == "support" and release[1] == spent.release.replace("-", "")[-8:]
    assert release[-1] == _money(support)
    # budgets: used of limit, and when the window resets (the page's zone is UTC)
    budgets = {(r[0], r[1]): r for r in _rows(tab, "#budgets")}
    assert set(budgets) == {
        ("global", "day"),
        ("scenario:support", "month"),
        ("key:app", "day"),
        ("key:root", "day"),
    }
    month = budgets[("scenario:support", "month")]
    assert month[2].strip() == f"{_money(support)} of 1000"
    assert month[3] == "—"  # no token limit
    now = datetime.now(UTC)
    first = datetime(now.year + now.month // 12, now.month % 12 + 1, 1)
    assert month[4] == f"{first:%Y-%m-%d} 00:00:00"
    root_tokens = budgets[("key:root", "day")][3].strip()
    assert root_tokens.endswith(" of 5") and int(root_tokens.split()[0]) >= 5
    # refusals: the root key's day budget (402) and claude's rate limit (429)
    assert sorted((r[0], r[1], r[2]) for r in _rows(tab, "#refusals")) == [
        ("key:root", "day budget · 402", "1"),
        ("scenario:claude", "rate limit · 429", "1"),
    ]
    assert tab.text("#budget-refused") == "1" and tab.text("#rate-refused") == "1"
    # Reef's own spend: each learning job's cost and its gate decision's, newest first
    # (Job, Scenario, Outcome, Candidate, Job cost, Gate decision, Finished)
    learning = _rows(tab, "#learning")
    assert [(r[0], r[1], r[2]) for r in learning] == [
        (spent.jobs["claude"].replace("-", "")[-8:], "claude", "budget_exhausted"),
        (spent.jobs["support"].replace("-", "")[-8:], "support", "proposed"),
    ]
    assert learning[0][4] == "10 calls, 100 tok, unpriced" and learning[0][5] == "—"
    assert learning[1][4] == "12 calls, 120 tok, 0.5000 (+2 unpriced), 3.5 cpu min"
    assert learning[1][5] == "published 4 calls, 40 tok, unpriced"
    # learning budgets: the scenario's and its recipe's, spent of each limit
    # (Budget, Purpose, Window, Spent, Resets)
    learning_budgets = {r[0]: r for r in _rows(tab, "#learning-budgets")}
    assert set(learning_budgets) == {
        "learn:scenario:support/judge/day",
        "learn:recipe:triage/total/month",
    }
    judge = learning_budgets["learn:scenario:support/judge/day"]
    assert (judge[1], judge[2]) == ("judge", "day") and "calls 3 of 10" in judge[3]
    total = learning_budgets["learn:recipe:triage/total/month"][3]
    assert "money 0.6000 of 2" in total and "cpu minutes 1.5 of 30" in total
    tab.screenshot("spend")
    # the period: the last day holds it all; a time after it, nothing (budgets still shown)
    tab.page.select_option("#since-filter", "24h")
    tab.wait("#/spend?since=24h")
    assert tab.text("#total-requests") == "6"
    tab.open("#/spend?since=2999-01-01T00:00:00Z")
    assert tab.text("#total-requests") == "0" and tab.text("#total-cost") == _money(0)
    assert "No recorded traffic in this period." in tab.text("#by-scenario")
    assert len(_rows(tab, "#budgets")) == 4
    assert tab.problems == []
    context.close()


def test_a_key_limited_to_a_scenario_sees_only_its_spend(
    spent: Spent, browser: Any, tmp_path: Path
) -> None:
    context, tab = _open(browser, spent, tmp_path, "ops-secret")
    support = sum(spent.costs["app"]) + sum(spent.costs["root"])
    assert [(r[0], r[1], r[6]) for r in _rows(tab, "#by-scenario")] == [
        ("support", "4", _money(support))
    ]
    assert tab.text("#total-requests") == "4" and tab.text("#total-unpriced") == "0"
    assert [(r[0], r[1]) for r in _rows(tab, "#budgets")] == [("scenario:support", "month")]
    assert "No request was refused" in tab.text("#refusals")
    assert [r[0] for r in _rows(tab, "#by-release")] == ["support"]
    assert [r[1] for r in _rows(tab, "#learning")] == ["support"]
    assert "claude" not in tab.text()
    assert tab.problems == []
    context.close()

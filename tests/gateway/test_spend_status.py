"""``/reef/status``'s spend beyond the budgets, and ``reef status`` printing it: the cost
of each release and of each scenario, key and purpose (the records' costs, unpriced ones
counted) and of each learning job and
its gate decision (from the job's stored result). A model with no price is served and
counted unpriced. Real gateway, official SDKs, the job queue in the gateway's store."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from reef.cli.main import app
from reef.config.spend import LearningBudgetLimit
from reef.core.prices import Price
from reef.experience import LEARNING_SPEND_FILE, LearningMeter, read_published
from reef.experience.learning_spend import LearningSpendCounts
from reef.gateway.budgets import learning_families
from tests.fakes.clock import FakeClock
from tests.gateway.harness import GatewayThread
from tests.gateway.test_budgets import clocked, upstreams

JOB_COST = {
    "model_calls": 7,
    "tokens": 140,
    "money": 0.25,
    "unpriced_calls": 2,
    "cpu_minutes": 1.5,
    "gpu_minutes": 0.0,
    "by_purpose": {"judge": {"calls": 7, "tokens": 140, "money": 0.25}},
}
GATE_SPEND = {
    "model_calls": 4,
    "tokens": 80,
    "money": None,
    "unpriced_calls": 4,
    "cpu_minutes": 0.0,
    "gpu_minutes": 0.0,
    "by_purpose": {"eval": {"calls": 4, "tokens": 80, "money": None}},
}


def _finish_job(gateway: GatewayThread, result: dict[str, Any]) -> str:
    queue = gateway.app.state.reef.jobs
    job = queue.enqueue("support", "learn", {})
    claimed = queue.claim("test-worker", 60.0)
    assert claimed is not None and claimed.id == job.id
    queue.complete(job.id, "test-worker", result)
    return job.id


def test_status_shows_the_cost_of_each_release_and_each_learning_job(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    # support's model has no price (served, counted unpriced); claude's has one
    gateway = clocked(make_gateway(upstreams=upstreams(fake.base_url, priced=False)), FakeClock())
    served = []
    for text in ("first", "second"):
        raw = gateway.openai().chat.completions.with_raw_response.create(
            model="reef/support", messages=[{"role": "user", "content": text}]
        )
        served.append(gateway.store.get_record(raw.headers["x-reef-record-id"]))
    raw_claude = gateway.anthropic().messages.with_raw_response.create(
        model="reef/claude", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    claude = gateway.store.get_record(raw_claude.headers["x-reef-record-id"])
    assert [r.cost for r in served] == [None, None] and claude.cost is not None
    job_id = _finish_job(
        gateway,
        {
            "outcome": "proposed",
            "cost": JOB_COST,
            "gate": {"action": "published", "cost": {"spend": GATE_SPEND}},
        },
    )

    with httpx.Client(base_url=gateway.url) as http:
        spend = http.get("/reef/status").json()["spend"]
        metrics = http.get("/metrics").text
    assert spend["releases"] == [
        {
            "scenario": "claude",
            "release": claude.release_id,
            "requests": 1,
            "unpriced": 0,
            "cost": claude.cost,
        },
        {
            "scenario": "support",
            "release": served[0].release_id,
            "requests": 2,
            "unpriced": 2,
            "cost": 0.0,
        },
    ]
    assert spend["keys"] == [
        {
            "scenario": "claude",
            "key": None,
            "purpose": "serve",
            "requests": 1,
            "unpriced": 0,
            "cost": claude.cost,
        },
        {
            "scenario": "support",
            "key": None,
            "purpose": "serve",
            "requests": 2,
            "unpriced": 2,
            "cost": 0.0,
        },
    ]
    [job] = spend["learning"]
    assert job["job_id"] == job_id and job["scenario"] == "support"
    assert job["outcome"] == "proposed" and job["cost"] == JOB_COST
    assert job["gate"] == {"action": "published", "spend": GATE_SPEND}
    assert 'reef_spend_unpriced_total{purpose="serve",scenario="support"} 2.0' in metrics

    result = CliRunner().invoke(app, ["status", "--url", gateway.url])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())  # rich may wrap long lines
    assert f"claude@{claude.release_id} {claude.cost:.4f} (1 requests)" in out
    assert f"support@{served[0].release_id} 0.0000 (2 requests, 2 unpriced)" in out
    assert f"claude/no key/serve {claude.cost:.4f} (1 requests)" in out
    assert "support/no key/serve 0.0000 (2 requests, 2 unpriced)" in out
    assert (
        f"learning job {job_id} (support, proposed): 7 calls, 140 tok, 0.2500 (+2 unpriced), "
        "1.5 cpu min; gate (published): 4 calls, 80 tok, unpriced"
    ) in out


def test_a_key_limited_to_a_scenario_sees_only_its_releases_and_jobs(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    gateway = make_gateway(
        upstreams=upstreams(fake.base_url),
        auth={
            "keys": [
                {"id": "ops", "key": "ops-secret", "role": "admin", "scenarios": ["claude"]},
                {"id": "root", "key": "root-secret", "role": "admin"},
            ]
        },
    )
    root = gateway.openai(api_key="root-secret")
    root.chat.completions.create(model="reef/support", messages=[{"role": "user", "content": "x"}])
    _finish_job(gateway, {"outcome": "budget_exhausted", "cost": JOB_COST})

    def spend(key: str) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {key}"}
        with httpx.Client(base_url=gateway.url, headers=headers) as http:
            found: dict[str, Any] = http.get("/reef/status").json()["spend"]
            return found

    everything = spend("root-secret")
    assert [r["scenario"] for r in everything["releases"]] == ["support"]
    assert [(r["scenario"], r["key"], r["purpose"]) for r in everything["keys"]] == [
        ("support", "root", "serve")
    ]
    assert [j["outcome"] for j in everything["learning"]] == ["budget_exhausted"]
    assert everything["learning"][0]["gate"] is None
    limited = spend("ops-secret")
    assert limited["releases"] == [] and limited["learning"] == [] and limited["keys"] == []


def test_metrics_count_reefs_own_learning_spend_by_purpose(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> None:
    """A learning meter of the gateway's process (``reef serve`` runs the worker in it)
    counts each purpose's calls, tokens and money, unpriced calls and training minutes in
    ``/metrics``."""
    gateway = make_gateway(upstreams=upstreams(fake.base_url))
    scenario = "metered"  # no other test's meter counts under it
    meter = LearningMeter(None, [], FakeClock(), scenario=scenario)
    gate = meter.child()
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    price = Price("m", input_per_mtok=1e6, output_per_mtok=1e6)  # a token costs 1
    meter.charge("judge", usage, price)
    meter.charge("judge", usage, None)
    meter.charge("reflect", {"input_tokens": 4, "output_tokens": 1}, price)
    meter.charge("teacher", usage, price)
    gate.charge("eval", usage, None)
    gate.charge("episode", usage, price)
    meter.charge_training("cpu", 1.5)
    with httpx.Client(base_url=gateway.url) as http:
        metrics = http.get("/metrics").text
    for line in (
        f'reef_learning_calls_total{{purpose="judge",scenario="{scenario}"}} 2.0',
        f'reef_learning_tokens_total{{purpose="judge",scenario="{scenario}"}} 10.0',
        f'reef_learning_cost_total{{purpose="judge",scenario="{scenario}"}} 5.0',
        f'reef_learning_unpriced_total{{purpose="judge",scenario="{scenario}"}} 1.0',
        f'reef_learning_cost_total{{purpose="reflect",scenario="{scenario}"}} 5.0',
        f'reef_learning_calls_total{{purpose="teacher",scenario="{scenario}"}} 1.0',
        f'reef_learning_unpriced_total{{purpose="eval",scenario="{scenario}"}} 1.0',
        f'reef_learning_cost_total{{purpose="episode",scenario="{scenario}"}} 5.0',
        f'reef_learning_training_minutes_total{{device="cpu",scenario="{scenario}"}} 1.5',
    ):
        assert line in metrics, line


def test_a_gateway_process_of_several_shows_what_its_parent_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``reef serve --workers N`` the learning worker counts in the parent, which
    publishes its counts in the metrics directory; each gateway process's ``/metrics``
    shows those (``PROMETHEUS_MULTIPROC_DIR`` set), not its own empty ones."""
    parent = LearningSpendCounts()
    published = tmp_path / LEARNING_SPEND_FILE
    parent.publish_to(published)
    parent.add("support", "judge", 5, 0.5)
    parent.add("support", "judge", 3, None)
    parent.add_minutes("support", "gpu", 2.0)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    samples = {
        (family.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in learning_families()
        for sample in family.samples
    }
    judge = (("purpose", "judge"), ("scenario", "support"))
    assert samples[("reef_learning_calls", judge)] == 2.0
    assert samples[("reef_learning_tokens", judge)] == 8.0
    assert samples[("reef_learning_cost", judge)] == 0.5
    assert samples[("reef_learning_unpriced", judge)] == 1.0
    gpu = (("device", "gpu"), ("scenario", "support"))
    assert samples[("reef_learning_training_minutes", gpu)] == 2.0
    parent.publish_to(None)
    parent.add("support", "judge", 1, None)  # no longer published
    still = read_published(published)
    assert still is not None and still["calls"] == {("support", "judge"): 2.0}
    published.write_bytes(b"{not json")
    assert read_published(published) is None


def test_status_shows_each_learning_budget_in_its_window(
    make_gateway: Callable[..., GatewayThread], fake: Any, tmp_path: Path
) -> None:
    """A scenario's ``learning_budget`` and its recipe file's, with what the store's
    ledger counted in the current window; ``reef status`` prints them."""
    recipe = tmp_path / "triage.yaml"
    recipe.write_text(
        "learners: [{type: fewshot}]\nlearning_budget: [{window: day, cpu_minutes: 30}]\n"
    )
    judge_calls = {"window": "hour", "purpose": "judge", "calls": 10}
    gateway = clocked(
        make_gateway(
            upstreams=upstreams(fake.base_url),
            scenarios={
                "support": {
                    "upstream": "fake",
                    "recipe": str(recipe),
                    "learning_budget": [judge_calls],
                },
                "claude": {"upstream": "claude"},
            },
        ),
        FakeClock(datetime(2026, 12, 5, 12, 30, tzinfo=UTC)),
    )
    budgets = [
        ("scenario:support", [LearningBudgetLimit.model_validate(judge_calls)]),
        ("recipe:triage", [LearningBudgetLimit(window="day", cpu_minutes=30)]),
    ]
    meter = LearningMeter(gateway.database, budgets, gateway.app.state.reef.spend.clock)
    for _ in range(4):
        meter.charge("judge", {"prompt_tokens": 2, "completion_tokens": 1}, None)
    meter.charge_training("cpu", 2.5)
    with httpx.Client(base_url=gateway.url) as http:
        rows = http.get("/reef/status").json()["spend"]["learning_budgets"]
    nothing = {f"{kind}_limit": None for kind in ("calls", "tokens", "money")}
    assert rows == [
        {
            "scenario": "support",
            "budget": "learn:scenario:support/judge/hour",
            "purpose": "judge",
            "window": "hour",
            "resets": "2026-12-05T13:00:00Z",
            "calls": 4,
            "tokens": 12,
            "money": 0.0,
            "cpu_minutes": 0.0,
            "gpu_minutes": 0.0,
            **nothing,
            "calls_limit": 10,
            "cpu_minutes_limit": None,
            "gpu_minutes_limit": None,
        },
        {
            "scenario": "support",
            "budget": "learn:recipe:triage/total/day",
            "purpose": "total",
            "window": "day",
            "resets": "2026-12-06T00:00:00Z",
            "calls": 4,
            "tokens": 12,
            "money": 0.0,
            "cpu_minutes": 2.5,
            "gpu_minutes": 0.0,
            **nothing,
            "cpu_minutes_limit": 30.0,
            "gpu_minutes_limit": None,
        },
    ]
    result = CliRunner().invoke(app, ["status", "--url", gateway.url])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert (
        "learning budget learn:scenario:support/judge/hour (hour): calls 4 of 10; "
        "resets 2026-12-05T13:00:00Z"
    ) in out
    assert "learning budget learn:recipe:triage/total/day (day): cpu minutes 2.5 of 30" in out

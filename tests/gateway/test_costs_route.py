"""``GET /reef/costs``: what ``reef costs`` prints, over HTTP for the dashboard's spend
page: rows from each record's own cost, grouped by key or release, only of the key's
scenarios, and a 400 naming a bad ``since`` or ``by``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.gateway.harness import GatewayThread
from tests.gateway.test_budgets import PRICES

KEYS = [
    {"id": "root", "key": "root-secret", "role": "admin"},
    {"id": "ops", "key": "ops-secret", "role": "admin", "scenarios": ["support"]},
    {"id": "app", "key": "app-secret"},
]


def _upstreams(fake_url: str) -> dict[str, Any]:
    common = {"read_timeout_seconds": 2, "total_timeout_seconds": 5}
    return {
        "fake": {"type": "openai", "base_url": fake_url, "model": "fake-model", "prices": PRICES}
        | common,
        "claude": {"type": "anthropic", "base_url": fake_url, "model": "fake-claude"} | common,
    }


def _costs(gateway: GatewayThread, key: str, **query: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(base_url=gateway.url, headers=headers) as http:
        return http.get("/reef/costs", params=query)


@pytest.fixture
def spent(
    make_gateway: Callable[..., GatewayThread], fake: Any
) -> tuple[GatewayThread, float, str | None]:
    """Two priced support requests and one unpriced claude request of the app key; the
    support records' summed cost and their release."""
    gateway = make_gateway(upstreams=_upstreams(fake.base_url), auth={"keys": KEYS})
    client = gateway.openai(api_key="app-secret")
    cost = 0.0
    for text in ("first question", "a second, longer question"):
        raw = client.chat.completions.with_raw_response.create(
            model="reef/support", messages=[{"role": "user", "content": text}]
        )
        record = gateway.store.get_record(raw.headers["x-reef-record-id"])
        assert record.cost is not None and record.cost > 0
        cost += record.cost
        release = record.release_id
    gateway.anthropic(api_key="app-secret").messages.create(
        model="reef/claude", max_tokens=20, messages=[{"role": "user", "content": "unpriced"}]
    )
    return gateway, cost, release


def test_costs_sums_each_records_cost_per_scenario_key_and_purpose(
    spent: tuple[GatewayThread, float, str | None],
) -> None:
    gateway, cost, release = spent
    answer = _costs(gateway, "root-secret", since="1h")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["by"] == "key" and body["since"].endswith("Z")
    rows = {(r["scenario"], r["key"], r["purpose"]): r for r in body["data"]}
    assert set(rows) == {("support", "app", "serve"), ("claude", "app", "serve")}
    support, claude = rows[("support", "app", "serve")], rows[("claude", "app", "serve")]
    assert support["requests"] == 2 and support["unpriced"] == 0
    assert support["cost"] == pytest.approx(cost)
    assert claude["requests"] == 1 and claude["unpriced"] == 1 and claude["cost"] == 0
    assert claude["input_tokens"] > 0  # tokens counted though unpriced
    by_release = _costs(gateway, "root-secret", by="release").json()["data"]
    assert release is not None
    first = by_release[0]  # costliest first
    assert (first["scenario"], first["release"], first["key"]) == ("support", release, None)
    # a time after every record: nothing
    assert _costs(gateway, "root-secret", since="2999-01-01T00:00:00Z").json()["data"] == []


def test_a_key_limited_to_scenarios_sees_only_their_costs(
    spent: tuple[GatewayThread, float, str | None],
) -> None:
    gateway, _, _ = spent
    rows = _costs(gateway, "ops-secret").json()["data"]
    assert [r["scenario"] for r in rows] == ["support"]
    assert _costs(gateway, "app-secret").status_code == 403  # an inference key


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ({"since": "a week"}, "'since'"),
        ({"since": "99999999999999d"}, "'since'"),
        ({"by": "purpose"}, "'by'"),
    ],
)
def test_a_bad_since_or_by_is_a_400_naming_it(
    spent: tuple[GatewayThread, float, str | None], query: dict[str, str], named: str
) -> None:
    gateway, _, _ = spent
    answer = _costs(gateway, "root-secret", **query)
    assert answer.status_code == 400
    assert named in answer.json()["error"]["message"]

"""Feedback keeps its author's trust level; keys limited to one scenario learn nothing
about another's records; admins list and release quarantined feedback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from reef.config import ReefSettings
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

KEYS = [
    {"id": "app", "key": "sk-app", "role": "inference"},
    {"id": "support-only", "key": "sk-support", "role": "inference", "scenarios": ["support"]},
    {"id": "crowd", "key": "sk-crowd", "role": "inference", "trust": "untrusted"},
    {"id": "ops", "key": "sk-ops", "role": "admin"},
]
ADMIN = {"authorization": "Bearer sk-ops"}


@pytest.fixture
def keyed(make_gateway: Callable[..., GatewayThread]) -> GatewayThread:
    return make_gateway(
        auth={"keys": KEYS},
        scenarios={
            "support": {"upstream": "fake", "trust": {"app": "operator"}},
            "billing": {"upstream": "fake"},
        },
    )


def serve(gateway: GatewayThread, key: str, scenario: str) -> str:
    raw = gateway.openai(key).chat.completions.with_raw_response.create(
        model=f"reef/{scenario}", messages=[{"role": "user", "content": "q"}]
    )
    return raw.headers["x-reef-record-id"]


def give(gateway: GatewayThread, key: str, body: dict[str, Any]) -> Any:
    return call(gateway.port, "POST", "/reef/feedback", body, {"authorization": f"Bearer {key}"})


def test_feedback_rows_keep_the_trust_of_their_author(keyed: GatewayThread) -> None:
    support = serve(keyed, "sk-ops", "support")
    billing = serve(keyed, "sk-ops", "billing")
    expected = [
        ("sk-app", support, "operator"),  # the scenario's override
        ("sk-app", billing, "user"),  # an inference key's default
        ("sk-crowd", billing, "untrusted"),  # the key's own level
        ("sk-ops", billing, "operator"),  # an admin key's default
    ]
    for key, record_id, _ in expected:
        assert give(keyed, key, {"record_ids": [record_id], "score": 1}).status == 201
    stored = [fb.trust for fb in keyed.store.get_record(support).feedback]
    stored += [fb.trust for fb in keyed.store.get_record(billing).feedback]
    assert stored == [level for _, _, level in expected]
    listed = call(keyed.port, "GET", "/reef/scenarios/billing/feedback", headers=ADMIN).json()
    assert [(row["principal"], row["trust"]) for row in listed["data"]] == [
        ("ops", "operator"),
        ("crowd", "untrusted"),
        ("app", "user"),
    ]


def test_another_scenarios_record_looks_like_a_missing_one(keyed: GatewayThread) -> None:
    theirs = serve(keyed, "sk-ops", "billing")
    foreign = give(keyed, "sk-support", {"record_ids": [theirs], "score": 1})
    missing = give(keyed, "sk-support", {"record_ids": ["01a2-no-such-record"], "score": 1})
    assert foreign.status == missing.status == 404
    assert foreign.json()["error"]["message"] == missing.json()["error"]["message"].replace(
        "01a2-no-such-record", theirs
    )
    assert foreign.json()["error"]["type"] == missing.json()["error"]["type"]
    named = give(keyed, "sk-support", {"record_ids": [theirs], "score": 1, "scenario": "support"})
    assert named.status == 404
    assert keyed.store.get_record(theirs).feedback == ()


def test_admins_list_and_release_quarantined_feedback(keyed: GatewayThread) -> None:
    record_id = serve(keyed, "sk-ops", "billing")
    created = give(keyed, "sk-crowd", {"record_ids": [record_id], "correction": "x"}).json()
    keyed.store.quarantine_feedback({created["id"]: "repeated_correction: test"})
    path = "/reef/scenarios/billing/feedback?quarantined=true"
    listed = call(keyed.port, "GET", path, headers=ADMIN).json()
    [row] = listed["data"]
    assert row["id"] == created["id"] and row["quarantined"] is True
    assert row["quarantine_reason"] == "repeated_correction: test"
    assert call(keyed.port, "GET", path, headers={"authorization": "Bearer sk-app"}).status == 403
    release = f"/reef/feedback/{created['id']}/release"
    assert call(keyed.port, "POST", release, {}, {"authorization": "Bearer sk-app"}).status == 403
    released = call(keyed.port, "POST", release, {}, ADMIN)
    assert released.status == 200
    assert released.json()["released_by"] == "ops" and released.json()["quarantined"] is False
    assert call(keyed.port, "GET", path, headers=ADMIN).json()["data"] == []
    again = call(keyed.port, "POST", release, {}, ADMIN)
    assert again.status == 409 and "not quarantined" in again.json()["error"]["message"]
    unknown = call(keyed.port, "POST", "/reef/feedback/nope/release", {}, ADMIN)
    assert unknown.status == 404
    bad = call(
        keyed.port, "GET", "/reef/scenarios/billing/feedback?quarantined=maybe", headers=ADMIN
    )
    assert bad.status == 400 and "quarantined" in bad.json()["error"]["message"]


def test_feedback_pages_by_before(keyed: GatewayThread) -> None:
    record_id = serve(keyed, "sk-ops", "billing")
    ids = [
        give(keyed, "sk-app", {"record_ids": [record_id], "score": n / 10}).json()["id"]
        for n in range(5)
    ]
    first = call(keyed.port, "GET", "/reef/scenarios/billing/feedback?limit=2", headers=ADMIN)
    page = first.json()
    assert [row["id"] for row in page["data"]] == ids[::-1][:2]
    second = call(
        keyed.port,
        "GET",
        f"/reef/scenarios/billing/feedback?limit=2&before={page['next_before']}",
        headers=ADMIN,
    ).json()
    assert [row["id"] for row in second["data"]] == ids[::-1][2:4]


def test_unknown_trust_levels_are_refused_naming_the_key(tmp_path: Any) -> None:
    base: dict[str, Any] = {
        "home": tmp_path,
        "upstreams": {"u": {"type": "openai", "base_url": "http://127.0.0.1:9"}},
    }
    with pytest.raises(ValidationError, match="api key 'crowd': unknown trust level 'root'"):
        ReefSettings(**base, auth={"keys": [{"id": "crowd", "key": "k", "trust": "root"}]})
    with pytest.raises(ValidationError, match="trust of api key 'app': unknown trust level"):
        ReefSettings(**base, scenarios={"s": {"trust": {"app": "admin"}}})
    with pytest.raises(ValidationError, match=r"unknown api key\(s\) \['ghost'\]"):
        ReefSettings(
            **base,
            auth={"keys": [{"id": "app", "key": "k"}]},
            scenarios={"s": {"trust": {"ghost": "user"}}},
        )


def test_without_keys_everyone_is_the_operator(gateway: GatewayThread) -> None:
    record_id = serve(gateway, "unused", "support")
    assert (
        call(gateway.port, "POST", "/reef/feedback", {"record_ids": [record_id], "score": 1}).status
        == 201
    )
    assert gateway.store.get_record(record_id).feedback[0].trust == "operator"


def test_feedback_idempotency_header_is_bounded(gateway: GatewayThread) -> None:
    record_id = serve(gateway, "unused", "support")
    body = {"record_ids": [record_id], "score": 1}
    too_long = call(
        gateway.port, "POST", "/reef/feedback", body, {"x-reef-idempotency-key": "k" * 257}
    )
    assert too_long.status == 400
    assert "x-reef-idempotency-key" in too_long.json()["error"]["message"]
    assert gateway.store.get_record(record_id).feedback == ()
    fits = call(gateway.port, "POST", "/reef/feedback", body, {"x-reef-idempotency-key": "k" * 256})
    assert fits.status == 201


@pytest.mark.parametrize("score", [-0.01, 1.5, 100])
def test_scores_outside_the_range_are_refused(gateway: GatewayThread, score: float) -> None:
    record_id = serve(gateway, "unused", "support")
    body = {"record_ids": [record_id], "score": score}
    response = call(gateway.port, "POST", "/reef/feedback", body)
    assert response.status == 400
    message = response.json()["error"]["message"]
    assert "outside scenario 'support'" in message and "[0, 1]" in message
    assert "scenarios.support.score_range" in message
    assert gateway.store.get_record(record_id).feedback == ()


def test_a_scenario_sets_its_own_score_range(make_gateway: Callable[..., GatewayThread]) -> None:
    gateway = make_gateway(scenarios={"support": {"upstream": "fake", "score_range": [1, 5]}})
    record_id = serve(gateway, "unused", "support")
    ok = call(gateway.port, "POST", "/reef/feedback", {"record_ids": [record_id], "score": 4})
    assert ok.status == 201
    low = call(gateway.port, "POST", "/reef/feedback", {"record_ids": [record_id], "score": 0})
    assert low.status == 400 and "[1, 5]" in low.json()["error"]["message"]
    with pytest.raises(ValidationError, match="score_range must be two finite numbers"):
        ReefSettings(
            upstreams={"u": {"type": "openai", "base_url": "http://127.0.0.1:9"}},
            scenarios={"s": {"score_range": [5, 1]}},
        )

"""Feedback and report: every rule and every error case."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call


def serve(gateway: GatewayThread, scenario: str = "support", text: str = "q") -> str:
    raw = gateway.openai().chat.completions.with_raw_response.create(
        model=f"reef/{scenario}", messages=[{"role": "user", "content": text}]
    )
    return raw.headers["x-reef-record-id"]


def feedback(gateway: GatewayThread, body: Any, path: str = "/reef/feedback", **headers: str):  # type: ignore[no-untyped-def]
    return call(gateway.port, "POST", path, body, headers)


def test_feedback_is_stored_and_readable(gateway: GatewayThread) -> None:
    record_id = serve(gateway)
    response = feedback(
        gateway,
        {
            "record_ids": [record_id],
            "score": 0.25,
            "feedback": "too vague",
            "correction": {"label": "billing"},
            "metadata": {"grader": "unit"},
        },
    )
    assert response.status == 201
    body = response.json()
    assert body["created"] is True
    record = gateway.store.get_record(record_id)
    assert len(record.feedback) == 1
    stored = record.feedback[0]
    assert stored.id == body["id"]
    assert stored.score == 0.25
    assert stored.feedback == "too vague"
    assert stored.correction == {"label": "billing"}
    assert stored.metadata == {"grader": "unit"}
    # via the admin API too
    view = call(gateway.port, "GET", f"/reef/records/{record_id}").json()
    assert view["feedback"][0]["score"] == 0.25


def test_report_uses_references(gateway: GatewayThread) -> None:
    ids = [serve(gateway, text="one"), serve(gateway, text="two")]
    response = feedback(gateway, {"references": ids, "score": 1}, "/reef/report")
    assert response.status == 201
    for record_id in ids:
        assert gateway.store.get_record(record_id).feedback[0].id == response.json()["id"]
    wrong = feedback(gateway, {"record_ids": ids, "score": 1}, "/reef/report")
    assert wrong.status == 400 and "references" in wrong.json()["error"]["message"]


def test_idempotency_same_body_same_id_different_body_409(gateway: GatewayThread) -> None:
    record_id = serve(gateway)
    body = {"record_ids": [record_id], "score": 1.0, "idempotency_key": "fb-1"}
    first = feedback(gateway, body)
    again = feedback(gateway, body)
    assert first.status == 201 and again.status == 200
    assert first.json()["id"] == again.json()["id"]
    assert again.json()["created"] is False
    conflict = feedback(gateway, {**body, "score": 0.0})
    assert conflict.status == 409
    assert "fb-1" in conflict.json()["error"]["message"]
    # the key may also come as a header
    by_header = feedback(
        gateway, {"record_ids": [record_id], "score": 1.0}, **{"x-reef-idempotency-key": "fb-1"}
    )
    assert by_header.status == 200 and by_header.json()["id"] == first.json()["id"]
    assert len(gateway.store.get_record(record_id).feedback) == 1


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"score": 1}, 400, "record_ids"),
        ({"record_ids": [], "score": 1}, 400, "record_ids"),
        ({"record_ids": ["x"], "score": "high"}, 400, "score"),
        ({"record_ids": ["x"], "bogus": 1}, 400, "unknown key 'bogus'; allowed keys here: "),
    ],
)
def test_invalid_feedback(gateway: GatewayThread, body: Any, status: int, fragment: str) -> None:
    response = feedback(gateway, body)
    assert response.status == status
    assert fragment in response.json()["error"]["message"]


def test_non_finite_score_is_rejected(gateway: GatewayThread) -> None:
    record_id = serve(gateway)
    response = call(
        gateway.port,
        "POST",
        "/reef/feedback",
        b'{"record_ids": ["' + record_id.encode() + b'"], "score": 1e999}',
    )
    assert response.status == 400
    assert "infinity" in response.json()["error"]["message"]
    assert gateway.store.get_record(record_id).feedback == ()


def test_unknown_record_is_404_naming_it(gateway: GatewayThread) -> None:
    known = serve(gateway)
    response = feedback(gateway, {"record_ids": [known, "no-such-record"], "score": 1})
    assert response.status == 404
    assert "no-such-record" in response.json()["error"]["message"]
    assert gateway.store.get_record(known).feedback == ()


def test_record_of_another_scenario_is_404(gateway: GatewayThread) -> None:
    mine = serve(gateway, "support")
    theirs = serve(gateway, "billing")
    response = feedback(gateway, {"record_ids": [mine, theirs], "score": 1})
    assert response.status == 404
    assert theirs in response.json()["error"]["message"]
    explicit = feedback(
        gateway, {"record_ids": [mine], "score": 1}, **{"x-reef-scenario": "billing"}
    )
    assert explicit.status == 404


def test_principal_is_stored(make_gateway) -> None:  # type: ignore[no-untyped-def]
    gateway = make_gateway(auth={"keys": [{"id": "grader", "key": "sk-g", "role": "inference"}]})
    raw = gateway.openai("sk-g").chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "q"}]
    )
    record_id = raw.headers["x-reef-record-id"]
    response = feedback(
        gateway, {"record_ids": [record_id], "score": 1}, authorization="Bearer sk-g"
    )
    assert response.status == 201
    assert gateway.store.get_record(record_id).feedback[0].principal == "grader"


def test_an_empty_scenario_header_is_no_header(gateway: GatewayThread) -> None:
    record_id = serve(gateway, "support")
    response = feedback(
        gateway,
        {"record_ids": [record_id], "score": 1},
        **{"x-reef-scenario": "", "x-reef-idempotency-key": ""},
    )
    assert response.status == 201, response.body  # the record's scenario, as without it
    stored = gateway.store.get_record(record_id).feedback
    assert [row.score for row in stored] == [1]

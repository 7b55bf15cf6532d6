"""``GET /reef/scenarios/{s}/feedback/calibration``: each computed feedback source measured
against posted feedback, as ``reef feedback calibrate`` prints it; admin only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reef.core import new_id
from reef.experience import FeedbackDraft, RecordDraft
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

KEYS = {
    "keys": [
        {"id": "ops", "key": "sk-admin", "role": "admin"},
        {"id": "app", "key": "sk-app", "role": "inference"},
    ]
}
PATH = "/reef/scenarios/support/feedback/calibration"


def record(gateway: GatewayThread) -> str:
    (record_id,) = gateway.store.write_records(
        [
            RecordDraft(
                id=new_id(), scenario="support", session_id=new_id(), api="openai.chat",
                request={"model": "m", "messages": [{"role": "user", "content": "q"}]},
                response={"choices": [{"message": {"role": "assistant", "content": "a"}}]},
                status="ok", error=None, latency_ms=1.0, usage=None, release_id=None,
                prompt_hash="sha256:" + "a" * 64, content_hash="sha256:" + new_id() * 2,
                continuation_hash=None,
            )
        ]
    )  # fmt: skip
    return record_id


def feedback(gateway: GatewayThread, record_id: str, score: float, **more: Any) -> None:
    gateway.store.add_feedback(
        FeedbackDraft(
            scenario="support", record_ids=(record_id,), score=score, feedback=None,
            correction=None, metadata={}, principal=None, idempotency_key=None, **more,
        )
    )  # fmt: skip


def test_each_computed_source_is_measured_against_posted_feedback(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(auth=KEYS)
    admin = {"authorization": "Bearer sk-admin"}
    empty = call(gateway.port, "GET", PATH, headers=admin)
    assert empty.status == 200 and empty.json() == {"scenario": "support", "data": []}
    agreed, disputed = record(gateway), record(gateway)
    for record_id in (agreed, disputed):
        feedback(gateway, record_id, 0.0, source="signal:correction", confidence=0.7)
    feedback(gateway, agreed, 0.0)  # people agree: a bad answer
    feedback(gateway, disputed, 1.0)  # people disagree: it was fine
    answer = call(gateway.port, "GET", PATH, headers=admin)
    assert answer.status == 200, answer.body
    (source,) = answer.json()["data"]
    assert source == {
        "source": "signal:correction", "rows": 2, "compared": 2, "polarity": "bad",
        "precision": 0.5, "recall": 1.0, "corrections_compared": 0, "corrections_agree": None,
    }  # fmt: skip
    refused = call(gateway.port, "GET", PATH, headers={"authorization": "Bearer sk-app"})
    assert refused.status == 403
    assert call(gateway.port, "GET", PATH).status == 401

"""A learning worker's gate outcome, sent as an evaluation event to a real receiver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reef.config import OtelConfig
from reef.evaluation import GateOutcome
from reef.evaluation.values import Decision, Interval, SuiteSummary
from reef.learning.worker import send_gate_result
from reef.telemetry.live import LiveExport
from tests.fakes.otlp import OtlpReceiver


@pytest.fixture
def live() -> Iterator[tuple[LiveExport, OtlpReceiver]]:
    with OtlpReceiver() as receiver:
        export = LiveExport(OtelConfig(enabled=True, endpoint=receiver.traces_url))
        try:
            yield export, receiver
        finally:
            export.shutdown()


def _decision(verdict: str) -> Decision:
    overall = SuiteSummary("all", 40, 0.8, 0.7, Interval(0.1, 0.02, 0.18, 40, 0.95))
    return Decision(verdict, ["a reason"], {}, overall, [overall])  # type: ignore[arg-type]


def test_a_decided_gate_is_sent_and_a_skipped_one_is_not(
    live: tuple[LiveExport, OtlpReceiver],
) -> None:
    export, receiver = live
    send_gate_result(export, "support", GateOutcome("cand-1", "skipped", None))
    send_gate_result(
        export, "support", GateOutcome("cand-2", "rejected", _decision("rejected"), "eval-9")
    )
    assert export.flush(timeout_seconds=10)
    (span,) = receiver.named("evaluation gate")
    ((name, event),) = span.events
    assert name == "gen_ai.evaluation.result"
    assert event["gen_ai.evaluation.name"] == "reef.gate"
    assert event["gen_ai.evaluation.score.label"] == "rejected"
    assert event["gen_ai.evaluation.score.value"] == 0.8
    assert event["reef.candidate.id"] == "cand-2"
    assert event["reef.evaluation.id"] == "eval-9"

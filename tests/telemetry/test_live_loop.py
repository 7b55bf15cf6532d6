"""Live export on an event loop: batches are written from the loop itself (no feeder
thread), and an export process that stops reading holds no request up and loses nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from reef.config import OtelConfig
from reef.experience import RecordDraft
from reef.telemetry import live as live_module
from reef.telemetry.live import LiveExport
from tests.fakes.otlp import OtlpReceiver

SPANS = 150
TEXT = "x" * 20_000  # 150 spans of 20 KB: three times what the pipe holds (1 MB)


def draft(number: int) -> RecordDraft:
    return RecordDraft(
        id=f"rec-{number}",
        scenario="support",
        session_id="sess-1",
        api="openai.chat",
        request={"model": "m", "messages": [{"role": "user", "content": TEXT}]},
        response=None,
        status="error",
        error="upstream refused",
        latency_ms=3.0,
        usage=None,
        release_id=None,
        prompt_hash="p",
        content_hash="c",
        continuation_hash=None,
    )


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as server:
        yield server


def test_a_stopped_export_process_blocks_no_request_and_loses_no_span(
    receiver: OtlpReceiver,
) -> None:
    config = OtelConfig(
        enabled=True,
        endpoint=receiver.traces_url,
        capture_content=True,
        max_export_batch_size=20,
        max_queue_size=400,
    )
    live = LiveExport(config)
    pid = live._process.pid
    os.kill(pid, signal.SIGSTOP)  # reads nothing until SIGCONT: the pipe fills

    async def serve() -> bool:
        for number in range(SPANS):  # a blocking write would hang this loop for good
            live.record(draft(number), "openai", None)
            await asyncio.sleep(0)
        assert live._backlog, "lines wait for the pipe"
        assert live._feeder is None
        assert "reef-otel-feeder" not in {thread.name for thread in threading.enumerate()}
        os.kill(pid, signal.SIGCONT)
        return await asyncio.to_thread(live.flush, 30)

    try:
        assert asyncio.run(serve())
    finally:
        os.kill(pid, signal.SIGCONT)
        live.shutdown()
    assert live.dropped_spans == 0
    spans = receiver.named("chat")
    assert sorted(int(span.attributes["reef.record.id"][4:]) for span in spans) == list(
        range(SPANS)
    )
    assert TEXT in spans[0].attributes["gen_ai.input.messages"]


def test_the_export_process_runs_only_on_idle_cpu(receiver: OtlpReceiver) -> None:
    """``SCHED_IDLE`` (else nice 19): under saturation serving goes first, export waits."""
    live = LiveExport(OtelConfig(enabled=True, endpoint=receiver.traces_url))
    try:
        live.gate("support", "cand-1", "eval-1", "passed", 0.9)
        assert live.flush(timeout_seconds=10)  # the process has read its config: it is set
        pid = live._process.pid
        idle = os.sched_getscheduler(pid) == os.SCHED_IDLE
        assert idle or os.getpriority(os.PRIO_PROCESS, pid) == 19
    finally:
        live.shutdown()
    assert len(receiver.named("evaluation gate")) == 1


def test_past_the_backlog_and_the_queue_spans_are_dropped_and_counted(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_module, "BACKLOG_BYTES", 200_000)
    config = OtelConfig(
        enabled=True,
        endpoint=receiver.traces_url,
        capture_content=True,
        max_export_batch_size=20,
        max_queue_size=40,
    )
    live = LiveExport(config)
    pid = live._process.pid
    os.kill(pid, signal.SIGSTOP)
    sent = 300  # 6 MB: the pipe (1 MB), the backlog (0.2 MB) and the queue (40) hold less

    async def serve() -> bool:
        for number in range(sent):
            live.record(draft(number), "openai", None)
            await asyncio.sleep(0)
        assert live._backlog_bytes >= 200_000
        assert len(live._queue) == 40
        os.kill(pid, signal.SIGCONT)
        return await asyncio.to_thread(live.flush, 30)

    try:
        assert asyncio.run(serve())
    finally:
        os.kill(pid, signal.SIGCONT)
        live.shutdown()
    received = len(receiver.named("chat"))
    assert live.dropped_spans > 0
    assert received + live.dropped_spans == sent

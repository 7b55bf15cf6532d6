"""Live export from the gateway: span descriptions queued on the request path, handed
in batches to the export process (``reef.telemetry.exporter``), which runs the
OpenTelemetry SDK and its OTLP exporter.

On the request path a record costs its attributes (a few microseconds) and an append to
a bounded queue: nothing waits for the collector or the export process, a full queue
drops the span (counted), and nothing here raises into a request. A feeder thread writes
each batch as one JSON line to the export process; a reader thread takes the counters
that process prints after each export, for ``/metrics``.
"""

from __future__ import annotations

import atexit
import logging
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

from reef.config import OtelConfig
from reef.core import dumps, loads
from reef.experience import FeedbackDraft, RecordDraft
from reef.telemetry.attributes import (
    EVALUATION_EVENT,
    feedback_attributes,
    gate_attributes,
    record_attributes,
    span_name,
    trace_ids,
)

log = logging.getLogger("reef.telemetry")

EXPORTER_COMMAND = [sys.executable, "-m", "reef.telemetry.exporter"]


def _hex_ids(record_id: str) -> list[str]:
    trace_id, span_id = trace_ids(record_id)
    return [f"{trace_id:032x}", f"{span_id:016x}"]


class LiveExport:
    """Sends records as spans and feedback and gate results as evaluation events (module
    doc). Every method returns at once and never raises."""

    def __init__(self, config: OtelConfig, command: list[str] | None = None) -> None:
        self.config = config
        self._queue: deque[dict[str, Any]] = deque()
        self._changed = threading.Condition()
        self._closing = False
        self._flush_now = False
        self.queued_spans = 0  # handed to the export process, or dropped there
        self.dropped_spans = 0  # dropped before it: the queue was full or the process gone
        self.counts = {"exported_spans": 0, "failed_exports": 0, "failed_spans": 0}
        self._process = subprocess.Popen(  # noqa: S603 (argv of our own interpreter, no shell)
            command or EXPORTER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._process.stdin is not None
        settings = config.model_dump(mode="json")
        settings["headers"] = {k: v.get_secret_value() for k, v in config.headers.items()}
        self._write(dumps(settings) + b"\n")
        self._feeder = threading.Thread(target=self._feed, name="reef-otel-feeder", daemon=True)
        self._reader = threading.Thread(target=self._read, name="reef-otel-reader", daemon=True)
        self._feeder.start()
        self._reader.start()
        # A process that never calls shutdown() (a worker run once) still sends its queue.
        atexit.register(self.shutdown)

    # -- what is sent ------------------------------------------------------------------

    def record(self, draft: RecordDraft, provider: str, pinned_release: str | None) -> None:
        """One CLIENT span for the recorded exchange ``draft``: ids derived from the record
        id, ending now and starting its latency earlier; an error or aborted record sets
        the span's status."""
        try:
            end = time.time_ns()
            error = (draft.error or draft.status) if draft.status in ("error", "aborted") else None
            self._put(
                {
                    "name": span_name(draft),
                    "kind": "client",
                    "ids": _hex_ids(draft.id),
                    "start": end - int(draft.latency_ms * 1_000_000),
                    "end": end,
                    "attributes": record_attributes(
                        draft, provider, pinned_release, self.config.capture_content
                    ),
                    "error": error,
                }
            )
        except Exception:
            log.exception("could not describe the span of record %s; not exported", draft.id)

    def feedback(self, feedback: FeedbackDraft, feedback_id: str) -> None:
        """A ``gen_ai.evaluation.result`` event on a span of its own, a child of the first
        rated record's span and linked to every rated record's span."""
        try:
            links = [_hex_ids(record_id) for record_id in feedback.record_ids]
            now = time.time_ns()
            self._put(
                {
                    "name": "evaluation feedback",
                    "kind": "internal",
                    "parent": links[0] if links else None,
                    "links": links,
                    "start": now,
                    "end": now,
                    "attributes": {},
                    "events": [
                        [
                            EVALUATION_EVENT,
                            feedback_attributes(feedback, feedback_id, self.config.capture_content),
                        ]
                    ],
                }
            )
        except Exception:
            log.exception("could not describe feedback %s; not exported", feedback_id)

    def gate(
        self,
        scenario: str,
        candidate_id: str,
        evaluation_id: str,
        verdict: str,
        score: float | None,
    ) -> None:
        """A finished gate evaluation as a ``gen_ai.evaluation.result`` event."""
        now = time.time_ns()
        attributes = gate_attributes(scenario, candidate_id, evaluation_id, verdict, score)
        self._put(
            {
                "name": "evaluation gate",
                "kind": "internal",
                "start": now,
                "end": now,
                "attributes": {},
                "events": [[EVALUATION_EVENT, attributes]],
            }
        )

    def _put(self, description: dict[str, Any]) -> None:
        with self._changed:
            if self._closing or len(self._queue) >= self.config.max_queue_size:
                self.dropped_spans += 1
                return
            self._queue.append(description)
            if len(self._queue) >= self.config.max_export_batch_size:
                self._changed.notify_all()

    # -- the threads -------------------------------------------------------------------

    def _feed(self) -> None:
        delay = self.config.schedule_delay_seconds
        while True:
            with self._changed:
                self._changed.wait_for(
                    lambda: (
                        self._closing
                        or self._flush_now
                        or len(self._queue) >= self.config.max_export_batch_size
                    ),
                    timeout=delay,
                )
                batch = list(self._queue)
                self._queue.clear()
                self._flush_now = False
                closing = self._closing
            if batch:
                if self._write(dumps(batch) + b"\n"):
                    with self._changed:
                        self.queued_spans += len(batch)
                else:
                    with self._changed:
                        self.dropped_spans += len(batch)
            if closing:
                return

    def _write(self, line: bytes) -> bool:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            stdin.write(line)
            stdin.flush()
        except (OSError, ValueError):  # the export process is gone
            log.warning("the OTel export process is gone (exit %s)", self._process.poll())
            return False
        return True

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            try:
                counts = loads(line)
            except ValueError:
                continue
            with self._changed:
                self.counts = counts
                self._changed.notify_all()

    # -- counters and lifecycle ----------------------------------------------------------

    @property
    def failed_exports(self) -> int:
        """Exports the collector did not take (down, refused, timed out)."""
        return self.counts["failed_exports"]

    def flush(self, timeout_seconds: float = 30.0) -> bool:
        """Wait until every span queued so far was exported or failed; False on timeout."""
        deadline = time.monotonic() + timeout_seconds
        with self._changed:
            target = self.queued_spans + len(self._queue)
            self._flush_now = True
            self._changed.notify_all()

            def done() -> bool:
                counts = self.counts
                return counts["exported_spans"] + counts["failed_spans"] >= target

            return self._changed.wait_for(done, timeout=max(0.0, deadline - time.monotonic()))

    def shutdown(self) -> None:
        """Hand over what is queued, let the export process send it (within its export
        timeout) and stop."""
        with self._changed:
            if self._closing:
                return
            self._closing = True
            self._changed.notify_all()
        atexit.unregister(self.shutdown)
        self._feeder.join()
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=self.config.timeout_seconds + 10)
        except subprocess.TimeoutExpired:
            log.warning("the OTel export process did not stop in time; killed")
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=5)
        if self._process.stdout is not None:
            self._process.stdout.close()

"""Live export from the gateway: records queued on the request path, handed in batches
to the export process (``reef.telemetry.exporter``), which builds their attributes,
encodes them as OTLP protobuf and sends them with the OpenTelemetry SDK's OTLP exporter.

On the request path a record costs its compact JSON (a few µs) appended to a bounded
queue: no attributes, no hashing, no lock unless a batch is full or the queue is, and
no object kept for the garbage collector to walk. Nothing waits for the collector or
the export process, a full queue drops the span (counted), and nothing here raises into
a request. Each batch goes to the export process as one JSON line of compact records (without
``capture_content``, only the request's model and the response's ids and finish reasons
leave), written from the gateway's event loop itself: a timer for a partial batch, and
a non-blocking pipe whose unwritten rest waits for ``loop.add_writer``. No thread of the
gateway competes with the loop for the GIL (``bench/otel_export.py``). A process without
an event loop (a worker, a command) gets a feeder thread instead. A reader thread,
blocked on the pipe back, takes the counters that process prints after each export, for
``/metrics``. Feedback and gate results, rare, are described here in full.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

import orjson

from reef.config import OtelConfig
from reef.core import dumps, loads
from reef.experience import FeedbackDraft, RecordDraft
from reef.telemetry.attributes import (
    EVALUATION_EVENT,
    feedback_attributes,
    finish_reasons,
    gate_attributes,
    trace_ids,
)

log = logging.getLogger("reef.telemetry")
# Called on every span: module globals, not attribute look-ups.
_dumps = orjson.dumps
_time_ns = time.time_ns
_thread_id = threading.get_ident

EXPORTER_COMMAND = [sys.executable, "-m", "reef.telemetry.exporter"]
PIPE_BYTES = 1 << 20  # the default /proc/sys/fs/pipe-max-size
# Batch lines, written already, that wait for the export process beyond what the pipe
# holds: about 50,000 spans without content (0.33 KB each), 30 s at 1,500 requests a
# second, while it runs only on idle CPU (``exporter.lower_priority``); then the queue.
BACKLOG_BYTES = 16 << 20


def _hex_ids(record_id: str) -> list[str]:
    trace_id, span_id = trace_ids(record_id)
    return [f"{trace_id:032x}", f"{span_id:016x}"]


class LiveExport:
    """Sends records as spans and feedback and gate results as evaluation events (module
    doc). Every method returns at once and never raises."""

    def __init__(self, config: OtelConfig, command: list[str] | None = None) -> None:
        self.config = config
        self._queue: deque[bytes] = deque()  # spans, each as its JSON
        # Read on every span: plain attributes, not the config's. ``_room`` is 0 once
        # closing, so that ``record`` leaves every span to ``_put``, which drops it.
        self._content = config.capture_content
        self._room = config.max_queue_size
        self._batch_size = config.max_export_batch_size
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
        self._fd = self._process.stdin.fileno()
        # A batch line is about 0.3 KB a span: a pipe that holds a whole batch takes it
        # in one write instead of 64 KB at a time, each waiting for the export process.
        with contextlib.suppress(OSError, AttributeError):  # Linux only, bounded by the OS
            fcntl.fcntl(self._fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        os.set_blocking(self._fd, False)
        self._io = threading.Lock()  # one writer of the pipe at a time
        # The event loop that writes (the first to queue a span), its timer and a line
        # the pipe has not taken yet; or, in a process without a loop, the feeder thread.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False
        self._backlog: deque[memoryview] = deque()  # lines the pipe has not taken yet
        self._backlog_bytes = 0
        self._feeder: threading.Thread | None = None
        settings = config.model_dump(mode="json")
        settings["headers"] = {k: v.get_secret_value() for k, v in config.headers.items()}
        self._write(dumps(settings) + b"\n")
        self._reader = threading.Thread(target=self._read, name="reef-otel-reader", daemon=True)
        self._reader.start()
        # A process that never calls shutdown() (a worker run once) still sends its queue.
        atexit.register(self.shutdown)

    # -- what is sent ------------------------------------------------------------------

    def record(self, draft: RecordDraft, provider: str, pinned_release: str | None) -> None:
        """One CLIENT span for the recorded exchange ``draft``: ids derived from the record
        id, ending now and starting its latency earlier; an error or aborted record sets
        the span's status (built by the export process, ``exporter.encode_record``).

        The record is encoded at once, as the compact JSON of its fixed-order fields
        (``wire_record``): a queue of bytes holds no objects for the garbage collector
        to walk, where drafts held until their batch left survived into its older
        generations. On the writing loop a span costs that and an append; the loop's
        timer or a full batch writes the queue (``_on_loop``)."""
        try:
            item = _dumps(wire_record(draft, provider, pinned_release, _time_ns(), self._content))
        except Exception:
            log.exception("record %s could not be encoded; not exported", draft.id)
            with self._changed:
                self.dropped_spans += 1
            return
        queue = self._queue
        if len(queue) < self._room and self._loop_thread == _thread_id():
            queue.append(item)
            if self._timer is None or len(queue) >= self._batch_size:
                self._on_loop()
            return
        self._put(item)

    def feedback(self, feedback: FeedbackDraft, feedback_id: str) -> None:
        """A ``gen_ai.evaluation.result`` event on a span of its own, a child of the first
        rated record's span and linked to every rated record's span."""
        try:
            links = [_hex_ids(record_id) for record_id in feedback.record_ids]
            now = time.time_ns()
            self._put(
                dumps(
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
                                feedback_attributes(
                                    feedback, feedback_id, self.config.capture_content
                                ),
                            ]
                        ],
                    }
                )
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
            dumps(
                {
                    "name": "evaluation gate",
                    "kind": "internal",
                    "start": now,
                    "end": now,
                    "attributes": {},
                    "events": [[EVALUATION_EVENT, attributes]],
                }
            )
        )

    def _put(self, item: bytes) -> None:
        """Queue ``item``; drop it (counted) when the queue is full or closing. The
        append is atomic (``deque``); then the writer is told, on the event loop that
        called first (``_on_loop``) or, in a process without one, by the feeder thread."""
        queue = self._queue
        if self._closing or len(queue) >= self.config.max_queue_size:
            with self._changed:
                self.dropped_spans += 1
            return
        queue.append(item)
        loop = self._loop
        if loop is None and self._feeder is None:
            loop = self._bind_loop()
        if loop is None:
            if len(queue) >= self.config.max_export_batch_size:
                with self._changed:
                    self._changed.notify_all()
        elif self._loop_thread == threading.get_ident():
            self._on_loop()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: shutdown() sends
                loop.call_soon_threadsafe(self._on_loop)

    def _bind_loop(self) -> asyncio.AbstractEventLoop | None:
        """The running event loop, now the writer's; else start the feeder thread."""
        with self._changed:
            if self._loop is None and self._feeder is None:
                try:
                    self._loop = asyncio.get_running_loop()
                    self._loop_thread = threading.get_ident()
                except RuntimeError:
                    self._feeder = threading.Thread(
                        target=self._feed, name="reef-otel-feeder", daemon=True
                    )
                    self._feeder.start()
            return self._loop

    # -- on the event loop -------------------------------------------------------------

    def _on_loop(self) -> None:
        """A full batch is written soon; a partial one when the schedule delay is over."""
        if self._closing or self._backlog_bytes >= BACKLOG_BYTES:  # ``_drained`` goes on
            return
        if len(self._queue) >= self.config.max_export_batch_size:
            if not self._soon:
                self._soon = True
                assert self._loop is not None
                self._loop.call_soon(self._write_from_loop)
        elif self._timer is None:
            assert self._loop is not None
            self._timer = self._loop.call_later(
                self.config.schedule_delay_seconds, self._write_from_loop
            )

    def _write_from_loop(self) -> None:
        """Write the queue as one line without waiting: what the pipe does not take now
        waits in the backlog (at most ``BACKLOG_BYTES``) for ``_drained``
        (``loop.add_writer``); past it the queue fills up to ``max_queue_size``, then
        drops (counted)."""
        self._soon = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closing or self._backlog_bytes >= BACKLOG_BYTES or not self._queue:
            return
        batch = self._take()
        line = self._line(batch)
        with self._io:
            written = 0
            if not self._backlog:
                try:
                    written = os.write(self._fd, line)
                except BlockingIOError:
                    pass
                except OSError:
                    self._gone(len(batch))
                    return
            with self._changed:
                self.queued_spans += len(batch)
            if written < len(line):
                if not self._backlog:
                    assert self._loop is not None
                    self._loop.add_writer(self._fd, self._drained)
                self._backlog.append(memoryview(line)[written:])
                self._backlog_bytes += len(line) - written

    def _drained(self) -> None:
        """The pipe takes bytes again: write the backlog, then the queue."""
        with self._io:
            if self._closing:
                return
            backlog = self._backlog
            while backlog:
                try:
                    written = os.write(self._fd, backlog[0])
                except BlockingIOError:
                    return
                except OSError:
                    self._gone(0)
                    written = len(backlog[0])
                self._backlog_bytes -= written
                if written < len(backlog[0]):
                    backlog[0] = backlog[0][written:]
                else:
                    backlog.popleft()
            assert self._loop is not None
            self._loop.remove_writer(self._fd)
        if self._queue:  # what waited for the pipe goes now, a full batch or not
            self._write_from_loop()

    def _gone(self, spans: int) -> None:
        log.warning("the OTel export process is gone (exit %s)", self._process.poll())
        with self._changed:
            self.dropped_spans += spans

    def _take(self) -> list[bytes]:
        queue = self._queue
        return [queue.popleft() for _ in range(len(queue))]

    # -- the feeder thread, in a process without an event loop -----------------------------

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
                batch = self._take()
                self._flush_now = False
                closing = self._closing
            if batch:
                if self._write(self._line(batch)):
                    with self._changed:
                        self.queued_spans += len(batch)
                else:
                    with self._changed:
                        self.dropped_spans += len(batch)
            if closing:
                return

    @staticmethod
    def _line(batch: list[bytes]) -> bytes:
        """The JSON line of ``batch``: a list of its spans."""
        return b"[" + b",".join(batch) + b"]\n"

    def _write(self, line: bytes) -> bool:
        """Write all of ``line``, waiting for the pipe when it is full (the feeder thread,
        ``shutdown``); False when the export process is gone."""
        view = memoryview(line)
        with self._io:
            try:
                while view:
                    try:
                        view = view[os.write(self._fd, view) :]
                    except BlockingIOError:
                        select.select([], [self._fd], [], 1.0)
            except OSError:  # the export process is gone
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
            if self._loop is not None:
                with contextlib.suppress(RuntimeError):  # a closed loop: nothing to wake
                    self._loop.call_soon_threadsafe(self._write_from_loop)

            def done() -> bool:
                counts = self.counts
                return counts["exported_spans"] + counts["failed_spans"] >= target

            return self._changed.wait_for(done, timeout=max(0.0, deadline - time.monotonic()))

    def _stop_loop_writer(self) -> None:
        """Stop the event loop's timer and pipe watch (the loop may be closed already)."""
        if self._timer is not None:
            self._timer.cancel()
        if self._loop is not None and self._backlog:
            with contextlib.suppress(Exception):  # closed, or its selector gone
                self._loop.remove_writer(self._fd)

    def shutdown(self) -> None:
        """Hand over what is queued, let the export process send it (within its export
        timeout) and stop."""
        with self._changed:
            if self._closing:
                return
            self._closing = True
            self._room = 0
            self._changed.notify_all()
        atexit.unregister(self.shutdown)
        if self._feeder is not None:
            self._feeder.join()
        self._stop_loop_writer()
        rest = self._take()
        line = b"".join([*self._backlog, self._line(rest) if rest else b""])
        self._backlog.clear()
        if line and self._write(line) and rest:
            with self._changed:
                self.queued_spans += len(rest)
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


def wire_record(
    draft: RecordDraft,
    provider: str,
    pinned_release: str | None,
    end: int,
    capture_content: bool,
) -> tuple[Any, ...]:
    """A record as the export process reads it: the fields of ``exporter.RECORD_FIELDS``
    in their order, values only (no dict is built): the request's model, the response's
    model, id and finish reasons (``attributes.finish_reasons``) and the usage as the
    upstream gave it; with ``capture_content`` the request and response follow
    (``exporter.CONTENT_FIELDS``), else no content leaves the gateway."""
    request = draft.request
    response = draft.response
    if response is None:
        response_model = response_id = None
        reasons: list[str] = []
    else:
        response_model = response.get("model")
        response_id = response.get("id")
        choices = response.get("choices")
        # One choice that says why it stopped (a chat completion): ``finish_reasons``'
        # answer, at a third of its cost.
        if (
            type(choices) is list
            and len(choices) == 1
            and type(choice := choices[0]) is dict
            and type(reason := choice.get("finish_reason")) is str
            and reason
        ):
            reasons = [reason]
        else:
            reasons = finish_reasons(response)
    fields = (
        draft.id,
        draft.session_id,
        draft.scenario,
        draft.api,
        draft.purpose,
        draft.status,
        draft.release_id,
        draft.error,
        draft.latency_ms,
        draft.usage,
        request.get("model"),
        response_model,
        response_id,
        reasons,
        provider,
        pinned_release,
        end,
    )
    if capture_content:
        return (*fields, request, response)
    return fields

"""The cells of ``bench/faults.py``: each fault, what is right for it, and one cell's run
(the request through an official SDK, the record, the gateway afterwards)."""

from __future__ import annotations

import enum
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import openai
from fault_clients import Seen, ask
from tests.fakes.upstream import FakeUpstreamThread

from reef.core.errors import NotFoundError
from reef.experience import SQLExperienceStore

# How a client reaches its upstream: "translated" is an Anthropic client on an
# OpenAI-compatible upstream (the gateway translates both ways).
DIALECTS = ("openai", "anthropic", "translated")
_PATHS = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "translated": "/v1/chat/completions",
}
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_MB = 1024 * 1024


@dataclass(frozen=True)
class Gateway:
    """A running ``reef serve``: its URL, process, log and SQLite database."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    database: Path

    def peak_rss_mb(self) -> float | None:
        """The process's peak resident memory so far (Linux), in MiB."""
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return None


@dataclass(frozen=True)
class Expect:
    """What is right for one cell."""

    status: int  # the HTTP status the client gets (200: an answer, or a failed stream)
    reason: str | None  # the record's error reason; None: an ok record of the answer
    event: int | None = None  # a stream failing after its headers: its error event's status
    attempts: int | None = None  # requests reaching the fake upstream
    wait_seconds: float = 0.0  # the answer comes no sooner (Retry-After)
    answer_bytes: int | None = None  # the answer's size (else it is "echo: <text>")


@dataclass(frozen=True)
class Fault:
    """One misbehaviour: the fake's token (plain and streaming request), the upstream it
    needs (``fake``, ``refused``, ``blackhole``) and what is right for each mode."""

    name: str
    title: str
    token: str | None
    stream_token: str | None
    plain: Expect
    streamed: Expect
    upstream: str = "fake"


def _failure(status: int, reason: str, attempts: int | None) -> Expect:
    return Expect(status, reason, attempts=attempts)


def _mid_stream(status: int, reason: str) -> Expect:
    return Expect(200, reason, event=status, attempts=1)


def faults(huge_bytes: int) -> tuple[Fault, ...]:
    """Every fault of the matrix, in order (``huge_bytes``: the huge answer's size)."""
    retried = Expect(200, None, attempts=2)
    huge = (huge_bytes // (64 * 1024)) * 64 * 1024  # the fake answers in 64 KiB words
    return (
        Fault(
            "refused", "connection refused", None, None,
            _failure(502, "upstream_unavailable", 0), _failure(502, "upstream_unavailable", 0),
            upstream="refused",
        ),
        Fault(
            "connect-timeout", "connect past connect_timeout", None, None,
            _failure(504, "upstream_timeout", 0), _failure(504, "upstream_timeout", 0),
            upstream="blackhole",
        ),
        Fault(
            "reset", "reset before headers", "reset-before-headers", "reset-before-headers",
            _failure(502, "upstream_unavailable", 3), _failure(502, "upstream_unavailable", 3),
        ),
        Fault(
            "500", "HTTP 500", "fail-500", "fail-500",
            _failure(502, "upstream_unavailable", 3), _failure(502, "upstream_unavailable", 3),
        ),
        Fault(
            "502", "HTTP 502", "fail-502", "fail-502",
            _failure(502, "upstream_unavailable", 3), _failure(502, "upstream_unavailable", 3),
        ),
        Fault(
            "503", "HTTP 503, Retry-After: 1, once", "fail-503-once", "fail-503-once",
            Expect(200, None, attempts=2, wait_seconds=1.0),
            Expect(200, None, attempts=2, wait_seconds=1.0),
        ),
        Fault("429", "HTTP 429, once", "fail-429-once", "fail-429-once", retried, retried),
        Fault(
            "headers-timeout", "headers past read_timeout", "hang", "hang",
            _failure(504, "upstream_timeout", 1), _failure(504, "upstream_timeout", 1),
        ),
        Fault(
            "stall", "body stalls", "stall-body", "stall-stream",
            _failure(504, "upstream_stalled", 1), _mid_stream(504, "upstream_stalled"),
        ),
        Fault(
            "cut", "cut before its end", "drop-mid-stream", "truncate-stream",
            _failure(502, "upstream_truncated", 1), _mid_stream(502, "upstream_truncated"),
        ),
        Fault(
            "malformed-json", "malformed JSON", "malformed-json", "malformed-stream",
            _failure(502, "upstream_malformed", 1), _mid_stream(502, "upstream_malformed"),
        ),
        Fault(
            "malformed-sse", "malformed SSE", "malformed-sse", "malformed-sse",
            _failure(502, "upstream_malformed", 1), _mid_stream(502, "upstream_malformed"),
        ),
        Fault(
            "content-type", "wrong content type (text/html)", "wrong-content-type",
            "wrong-content-type",
            _failure(502, "upstream_malformed", 1), _failure(502, "upstream_malformed", 1),
        ),
        Fault(
            "huge", f"{huge_bytes / _MB:.0f} MB answer", "huge-answer", "huge-answer",
            Expect(200, None, attempts=1, answer_bytes=huge),
            Expect(200, None, attempts=1, answer_bytes=huge),
        ),
    )  # fmt: skip


FAULTS = faults(100 * _MB)


class Outcome(enum.Enum):
    RIGHT = "yes"
    WRONG = "**no**"


@dataclass
class Cell:
    """One fault, client dialect and mode (streaming or not), as run."""

    fault: Fault
    dialect: str
    stream: bool
    seen: Seen
    attempts: int
    record: str
    after: str
    problems: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> Outcome:
        return Outcome.WRONG if self.problems else Outcome.RIGHT

    def row(self) -> str:
        verdict = self.outcome.value
        if self.problems:
            verdict += ": " + "; ".join(self.problems)
        return (
            f"| {self.fault.title} | {self.dialect} | {'yes' if self.stream else 'no'} | "
            f"{self.seen.text()} | {self.attempts} | {self.record} | {self.after} | {verdict} |"
        )

    def line(self) -> str:
        mode = "stream" if self.stream else "plain"
        verdict = "ok   " if not self.problems else "WRONG"
        tail = f"  <- {'; '.join(self.problems)}" if self.problems else ""
        return (
            f"{verdict} {self.fault.name:<16} {self.dialect:<10} {mode:<6} "
            f"{self.seen.text():<40} attempts {self.attempts}  record {self.record}"
            f"  after {self.after}{tail}"
        )


def run_cell(
    fault: Fault,
    dialect: str,
    stream: bool,
    serial: int,
    client: openai.OpenAI | anthropic.Anthropic,
    fake: FakeUpstreamThread,
    gateway: Gateway,
    store: SQLExperienceStore,
) -> Cell:
    """Send the cell's request, then check the record and the gateway."""
    token = fault.stream_token if stream else fault.token
    text = f"{token or 'hello'} cell-{serial}"
    scenario = f"{dialect}-{fault.upstream}"
    before = fake.requests_received(_PATHS[dialect])
    started = time.monotonic()
    seen = ask(client, scenario, text, stream)
    seen.seconds = time.monotonic() - started
    attempts = fake.requests_received(_PATHS[dialect]) - before
    expect = fault.streamed if stream else fault.plain
    record, problems = _check_record(store, seen.receipt, expect)
    problems = _check_seen(seen, expect, text) + problems
    if expect.attempts is not None and attempts != expect.attempts:
        problems.append(f"{attempts} upstream attempts, not {expect.attempts}")
    after = _check_gateway(client, gateway, serial, dialect)
    if after != "up":
        problems.append(f"gateway after: {after}")
    return Cell(fault, dialect, stream, seen, attempts, record, after, problems)


def _check_seen(seen: Seen, expect: Expect, text: str) -> list[str]:
    problems = []
    if seen.status != expect.status:
        problems.append(f"status {seen.status}, not {expect.status}")
    if not seen.shaped:
        problems.append("the error is not in the client's dialect")
    if seen.event != expect.event:
        problems.append(f"error event {seen.event}, not {expect.event}")
    if expect.event is not None and not seen.message.startswith(f"{expect.reason}:"):
        problems.append(f"error event message {seen.message[:60]!r}")
    if expect.reason is None:
        if expect.answer_bytes is not None:
            size = len(seen.answer or "")
            if size != expect.answer_bytes:
                problems.append(f"answer of {size} bytes, not {expect.answer_bytes}")
        elif seen.answer != f"echo: {text}":
            problems.append(f"answer {str(seen.answer)[:40]!r}")
        if seen.seconds < expect.wait_seconds:
            problems.append(f"answered after {seen.seconds:.2f} s, before Retry-After")
    return problems


def _check_record(
    store: SQLExperienceStore, receipt: str | None, expect: Expect
) -> tuple[str, list[str]]:
    if receipt is None:
        return "no receipt", ["no x-reef-record-id"]
    try:
        record = store.get_record(receipt)
    except NotFoundError:
        return "missing", [f"receipt {receipt} is not in the store"]
    reason = (record.error or "").split(":", 1)[0] if record.error else None
    shown = f"`{record.status}`" + (f" `{reason}`" if reason else "")
    if expect.reason is None:
        if record.status != "ok":
            return shown, [f"record {record.status}: {record.error}"]
        return shown, []
    if record.status != "error" or reason != expect.reason:
        return shown, [f"record {record.status} {record.error!r}, not error {expect.reason}"]
    return shown, []


def _check_gateway(
    client: openai.OpenAI | anthropic.Anthropic, gateway: Gateway, serial: int, dialect: str
) -> str:
    """``up`` when the process lives, /healthz answers and a normal request is served."""
    if gateway.process.poll() is not None:
        return f"exited {gateway.process.returncode}"
    try:
        with _OPENER.open(gateway.url + "/healthz", timeout=10) as response:
            if response.status != 200:
                return f"/healthz {response.status}"
    except OSError as exc:
        return f"/healthz failed: {exc}"
    text = f"hello after cell-{serial}"
    seen = ask(client, f"{dialect}-fake", text, stream=False)
    if seen.status != 200 or seen.answer != f"echo: {text}":
        return f"a normal request got {seen.text()}"
    return "up"

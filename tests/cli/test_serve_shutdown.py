"""``reef serve`` stopping with a request in flight: it says what it waits for, cuts the
request cleanly once the grace is over (or at a second Ctrl-C), and the record says the
gateway stopped, not the client."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from reef.db import open_database
from reef.experience import SQLExperienceStore
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import free_port
from tests.polling import eventually

# Some of the answer, then silence until the gateway hangs up: only a cut ends it.
STALLING = "stall-stream one two three four five six seven eight"
# No answer at all until the gateway hangs up.
HANGING = "hang"


@dataclass
class Client:
    """An OpenAI SDK client asking the gateway on a thread of its own: a stream that
    stalls after a few events, or a completion whose upstream never answers."""

    port: int
    stream: bool
    record_id: queue.Queue[str] = field(default_factory=queue.Queue)
    chunks: int = 0
    error: openai.APIError | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1", api_key="x", max_retries=0
        )
        try:
            if self.stream:
                self._stream(client)
            else:
                client.chat.completions.create(
                    model="reef/default", messages=[{"role": "user", "content": HANGING}]
                )
        except openai.APIStatusError as exc:
            self.record_id.put(exc.response.headers.get("x-reef-record-id", ""))
            self.error = exc
        except openai.APIError as exc:
            self.error = exc
        finally:
            client.close()
            self.done.set()

    def _stream(self, client: openai.OpenAI) -> None:
        with client.chat.completions.with_streaming_response.create(
            model="reef/default", messages=[{"role": "user", "content": STALLING}], stream=True
        ) as response:
            self.record_id.put(response.headers["x-reef-record-id"])
            for _ in response.parse():
                self.chunks += 1


def _lines(stream: object, into: queue.Queue[str | None]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line)
    into.put(None)


def _next_line_with(lines: queue.Queue[str | None], text: str, seen: list[str]) -> str:
    while True:
        line = lines.get(timeout=60)
        assert line is not None, f"stdout ended before {text!r}: {''.join(seen)}"
        seen.append(line)
        if text in line:
            return line


@pytest.fixture
def stalling_upstream() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread() as fake:
        yield fake


@pytest.mark.parametrize(
    ("grace", "signals", "stream"),
    [(60, 2, True), (0, 1, True), (60, 2, False)],
    ids=["a second ctrl-c cuts a stream", "the grace ends", "a call waiting for its upstream"],
)
def test_stopping_with_a_request_in_flight_cuts_it_cleanly(
    tmp_path: Path, stalling_upstream: FakeUpstreamThread, grace: int, signals: int, stream: bool
) -> None:
    port = free_port()
    (tmp_path / "reef.yaml").write_text(
        f"server: {{port: {port}, shutdown_grace_seconds: {grace}}}\n"
        f"upstreams:\n  u: {{type: openai, base_url: '{stalling_upstream.base_url}', model: m}}\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "reef", "serve", "--no-worker", "--log-level", "WARNING"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
    seen: list[str] = []
    client = Client(port, stream)
    try:
        _next_line_with(lines, "Reef is ready", seen)
        threading.Thread(target=client.run, daemon=True).start()
        if stream:
            eventually(lambda: client.chunks > 0, "the first chunks to reach the client")
        else:
            eventually(
                lambda: stalling_upstream.requests_received("/v1/chat/completions"),
                "the request to reach the upstream",
            )

        process.send_signal(signal.SIGINT)
        waiting = _next_line_with(lines, "waiting for", seen)
        assert waiting.strip() == f"waiting for 1 request, {grace} s grace; Ctrl-C again to abort"
        if signals == 2:
            assert not client.done.is_set()  # the grace is on: the stream goes on
            process.send_signal(signal.SIGINT)
        cutting = _next_line_with(lines, "cutting", seen)
        assert cutting.strip() == "cutting 1 request still running: the gateway stopped"
        assert client.done.wait(60), "the client's request did not end"
        record_id = client.record_id.get(timeout=60)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = process.stderr.read() if process.stderr else ""
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()

    assert process.returncode == 130, stderr  # stopped by Ctrl-C
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr
    assert "Cancel" not in stderr, stderr  # uvicorn never had to cancel a task
    # A stream: the events sent so far, then an error event saying why it ended; a call
    # still waiting: a 503 saying the same.
    assert isinstance(client.error, openai.APIError), client.error
    if stream:
        assert "interrupted: the gateway stopped" in client.error.message
    else:
        assert isinstance(client.error, openai.APIStatusError)
        assert client.error.status_code == 503
        assert "the gateway stopped" in client.error.message
    database = open_database(f"sqlite:///{tmp_path / '.reef' / 'reef.db'}")
    try:
        record = SQLExperienceStore(database).get_record(record_id)
    finally:
        database.close()
    assert record.status == "aborted"
    assert record.error == "interrupted: the gateway stopped"

"""``reef serve --workers 2``: two gateway processes on one port and one store, on
SQLite and on PostgreSQL (skipped without ``REEF_TEST_POSTGRES_URL``)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from sqlalchemy import func, select

from reef.db.schema import idempotency_claims
from reef.experience import RecordFilter, SQLExperienceStore
from reef.harness import Bundle, Harness, pack_bundle
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.experience.conftest import PG_ENV, ThrowawayDatabases
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import child_pids, free_port
from tests.gateway.rawhttp import RawResponse, call
from tests.polling import eventually

KEY = "x-reef-idempotency-key"


def _chat(text: str) -> dict[str, object]:
    return {"model": "reef/shared", "messages": [{"role": "user", "content": text}]}


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'reef.db'}"
        return
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is not set; the PostgreSQL variant needs a server")
    databases = ThrowawayDatabases(url)
    try:
        yield databases.create()
    finally:
        databases.drop_all()


class Served:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process, self.port, self.log = process, port, log

    def ask(self, text: str, **headers: str) -> RawResponse:
        return call(self.port, "POST", "/v1/chat/completions", _chat(text), headers)

    def workers_seen(self, rounds: int = 8) -> set[int]:
        """The workers that answered ``rounds`` health checks sent at once."""
        with ThreadPoolExecutor(rounds) as pool:
            answers = list(pool.map(lambda _: call(self.port, "GET", "/healthz"), range(rounds)))
        return {int(answer.json()["worker"]) for answer in answers}


@pytest.fixture
def served(tmp_path: Path, store_url: str) -> Iterator[tuple[Served, FakeUpstreamThread]]:
    port = free_port()
    log = tmp_path / "serve.log"
    with FakeUpstreamThread() as fake, log.open("wb") as log_file:
        config = {
            "home": str(tmp_path / "home"),
            "server": {"port": port},  # workers from the command line
            "store": {"url": store_url},
            "artifacts": {"url": str(tmp_path / "artifacts")},
            "upstreams": {
                "fake": {"type": "openai", "base_url": fake.base_url, "model": "fake-model"}
            },
            "scenarios": {"shared": {"harness": "managed"}},
            "activation": {"poll_interval_seconds": 0.5},
        }
        path = tmp_path / "reef.yaml"
        path.write_text(yaml.safe_dump(config))
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reef",
                "serve",
                "-c",
                str(path),
                "--workers",
                "2",
                "--no-worker",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        gateway = Served(process, port, log)
        try:

            def up() -> bool:
                assert process.poll() is None, log.read_text()
                return "Reef is ready" in log.read_text()  # printed once both answer

            eventually(up, "the gateway to start", timeout_seconds=90)
            yield gateway, fake
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def _requests_counted(metrics: str) -> int:
    pattern = re.compile(r'^reef_requests_total\{route="([^"]+)",status="(\d+)"\} (\S+)$')
    total = 0.0
    for line in metrics.splitlines():
        match = pattern.match(line)
        if match and "chat" in match.group(1):
            total += float(match.group(3))
    return int(total)


def _publish_new_head(store_url: str, artifacts: Path) -> str:
    store = SQLExperienceStore.from_url(store_url)
    try:
        chain = ReleaseChain(store.database)
        head = chain.head("shared")
        assert head is not None
        bundle = Bundle(harness=Harness(schema_version=1, system_prompt="v2"), files={})
        harness = open_artifact_store(str(artifacts)).put_bytes(pack_bundle(bundle), "harness")
        manifest = ReleaseManifest(model=ModelComponent(base="fake-model"), harness=harness)
        candidate = chain.propose("shared", manifest, head.id, "test", "v2")
        return chain.publish(candidate.id, head.id, "test", "v2", require_passed=False).id
    finally:
        store.close()


def test_two_workers_share_the_port_the_store_and_the_metrics(
    served: tuple[Served, FakeUpstreamThread], store_url: str, tmp_path: Path
) -> None:
    gateway, fake = served
    seen: set[int] = set()

    def both_answer() -> bool:
        seen.update(gateway.workers_seen())
        return seen == {1, 2}

    eventually(both_answer, "both workers to answer", timeout_seconds=30)

    # One idempotency key sent at once: one record under the key and one upstream call
    # (single flight in each worker, a claim in the store between them).
    with ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(lambda _: gateway.ask("one key for all", **{KEY: "burst"}), range(8))
        )
    assert all(reply.status == 200 for reply in replies), [r.body for r in replies]
    assert fake.requests_received("/v1/chat/completions") == 1
    receipts = {reply.headers["x-reef-record-id"] for reply in replies}
    store = SQLExperienceStore.from_url(store_url)
    try:
        keyed = [
            record
            for record in store.list_records("shared", RecordFilter(), None, 200).records
            if record.idempotency_key == "burst"
        ]
        assert len(keyed) == 1
        for receipt in receipts:
            assert store.get_record(receipt).status == "ok"
    finally:
        store.close()
    # Later, from either worker: answered from the store, no new upstream call.
    before = fake.requests_received("/v1/chat/completions")
    again = [gateway.ask("one key for all", **{KEY: "burst"}) for _ in range(4)]
    assert {reply.headers["x-reef-record-id"] for reply in again} == {keyed[0].id}
    assert fake.requests_received("/v1/chat/completions") == before

    # /metrics, whichever worker answers, counts the requests of both.
    sent = len(replies) + len(again)
    for _ in range(4):
        metrics = call(gateway.port, "GET", "/metrics").body.decode()
        assert _requests_counted(metrics) == sent

    # A new head: each worker says it serves it (its log lines carry its index), and
    # requests to the port get it.
    release = _publish_new_head(store_url, tmp_path / "artifacts")

    def both_flipped() -> bool:
        text = gateway.log.read_text()
        return all(f"[{i}]: scenario shared now serves release {release}" in text for i in (1, 2))

    eventually(both_flipped, "both workers to serve the new head", timeout_seconds=10)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: gateway.ask(f"which {i}"), range(8)))
    assert {answer.headers["x-reef-release-id"] for answer in answers} == {release}

    # Stopped as one process is: drained, then ended by the signal, with nothing failed.
    gateway.process.send_signal(signal.SIGTERM)
    assert gateway.process.wait(timeout=60) == -signal.SIGTERM, gateway.log.read_text()
    assert "error" not in gateway.log.read_text().lower()


def test_connections_opened_at_once_are_spread_over_the_workers(
    served: tuple[Served, FakeUpstreamThread],
) -> None:
    """16 keep-alive connections opened in one burst, as a client pool does: the parent
    sends each to the worker with the fewest open, so both serve a fair share (with one
    accept queue shared by the workers, the first to wake took the whole burst)."""
    gateway, _ = served
    connections = [
        http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30) for _ in range(16)
    ]

    def worker_of(connection: http.client.HTTPConnection) -> int:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        assert response.status == 200 and not response.will_close
        return int(json.loads(response.read())["worker"])

    try:
        for connection in connections:
            connection.connect()
        first = [worker_of(connection) for connection in connections]
        again = [worker_of(connection) for connection in connections]
    finally:
        for connection in connections:
            connection.close()
    assert again == first  # each connection stays with the worker it was sent to
    shares = Counter(first)
    assert set(shares) == {1, 2} and min(shares.values()) >= 4, shares
    # What an operator sees: connections taken per worker, whichever answers the scrape
    # (its own connection counted too).
    taken = _connections_taken(call(gateway.port, "GET", "/metrics").body.decode())
    assert sum(taken.values()) == 17 and min(taken.get(w, 0) for w in (1, 2)) >= 4, taken


def _connections_taken(metrics: str) -> dict[int, int]:
    pattern = re.compile(r'^reef_connections_total\{worker="(\d+)"\} (\S+)$')
    matches = (pattern.match(line) for line in metrics.splitlines())
    return {int(m.group(1)): int(float(m.group(2))) for m in matches if m}


def _sdk_ask(client: openai.OpenAI, text: str, key: str, stream: bool) -> tuple[int, str, Any]:
    """Status, receipt and answer (a completion's JSON, or a stream's text) of one
    keyed request through the OpenAI SDK; an API error's message as its answer."""
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="reef/shared",
            messages=[{"role": "user", "content": text}],
            stream=stream,
            extra_headers={KEY: key},
        )
    except openai.APIStatusError as exc:
        return exc.status_code, "", exc.message
    receipt = raw.headers.get("x-reef-record-id", "")
    parsed: Any = raw.parse()
    if stream:
        answer = "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
        return raw.status_code, receipt, answer
    return raw.status_code, receipt, parsed.model_dump()


def _store_waits(port: int) -> float:
    """Requests, of every worker, that waited on another worker's claim (``/metrics``)."""
    metrics = call(port, "GET", "/metrics").body.decode()
    for line in metrics.splitlines():
        if line.startswith('reef_idempotency_waits_total{where="store"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _across_workers(
    gateway: Served,
    fake: FakeUpstreamThread,
    client: openai.OpenAI,
    text: str,
    key: str,
    stream: bool,
) -> list[tuple[int, str, Any]]:
    """The replies to one keyed request sent while its first copy is held at the upstream,
    again and again until a copy waits on the other worker's claim; then let go."""
    waited = _store_waits(gateway.port)
    with ThreadPoolExecutor(48) as pool:
        futures = [pool.submit(_sdk_ask, client, text, key, stream)]
        eventually(lambda: fake.held == 1, "the first request at the upstream")

        def other_worker_waits() -> bool:
            if _store_waits(gateway.port) > waited:
                return True
            if len(futures) < 48:
                futures.append(pool.submit(_sdk_ask, client, text, key, stream))
            return False

        eventually(other_worker_waits, "a request waiting on the other worker's claim")
        assert fake.held == 1  # the waiting worker did not call the upstream
        fake.release_held()
        return [future.result(timeout=60) for future in futures]


def test_two_workers_share_idempotency_keys(
    served: tuple[Served, FakeUpstreamThread], store_url: str
) -> None:
    """Requests with one key reaching both workers at once: one upstream call, one
    record, one answer and receipt for all; another body under the key is a 409."""
    gateway, fake = served
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{gateway.port}/v1", api_key="none", max_retries=0
    )
    store = SQLExperienceStore.from_url(store_url)
    try:
        for stream in (False, True):
            fake.reset()
            key = f"together-{stream}"
            text = "hold-answer one answer for both workers"
            replies = _across_workers(gateway, fake, client, text, key, stream)
            assert fake.requests_received("/v1/chat/completions") == 1
            assert {status for status, _, _ in replies} == {200}, replies
            keyed = [
                r
                for r in store.list_records("shared", RecordFilter(), None, 200).records
                if r.idempotency_key == key
            ]
            assert len(keyed) == 1 and keyed[0].status == "ok"
            assert {receipt for _, receipt, _ in replies} == {keyed[0].id}
            answers = [answer for _, _, answer in replies]
            assert all(answer == answers[0] for answer in answers)
            assert "one answer for both workers" in str(answers[0])

        # Another body under a key in flight on one worker: 409 from either, no call.
        fake.reset()
        with ThreadPoolExecutor(9) as pool:
            first = pool.submit(_sdk_ask, client, "hold-answer the first", "taken", False)
            eventually(lambda: fake.held == 1, "the first request at the upstream")
            others = list(
                pool.map(lambda _: _sdk_ask(client, "another body", "taken", False), range(8))
            )
            fake.release_held()
            assert first.result(timeout=60)[0] == 200
        later = _sdk_ask(client, "another body", "taken", False)
        for status, _, message in [*others, later]:
            assert status == 409 and "different request" in str(message), message
        assert fake.requests_received("/v1/chat/completions") == 1

        # Every claim released once its record was stored.
        def released() -> bool:
            with store.database.read() as conn:
                return not conn.scalar(select(func.count()).select_from(idempotency_claims))

        eventually(released, "the claims released")
    finally:
        client.close()
        store.close()


def test_records_of_both_workers_number_one_session_in_turn(
    served: tuple[Served, FakeUpstreamThread], store_url: str
) -> None:
    """Turns of one session served by both workers at once: numbered 0..n-1 with no
    gap or repeat (each worker writes its own records; the store numbers a turn inside
    the transaction that inserts it)."""
    gateway, _ = served
    before = _connections_taken(call(gateway.port, "GET", "/metrics").body.decode())
    with ThreadPoolExecutor(16) as pool:
        replies = list(
            pool.map(lambda i: gateway.ask(f"turn {i}", **{"x-reef-session": "one"}), range(16))
        )
    assert all(reply.status == 200 for reply in replies), [r.body for r in replies]
    after = _connections_taken(call(gateway.port, "GET", "/metrics").body.decode())
    assert all(after.get(w, 0) > before.get(w, 0) for w in (1, 2)), (before, after)
    store = SQLExperienceStore.from_url(store_url)
    try:
        records = [
            r
            for r in store.list_records("shared", RecordFilter(), None, 200).records
            if r.session_id == "one"
        ]
    finally:
        store.close()
    assert {r.id for r in records} == {reply.headers["x-reef-record-id"] for reply in replies}
    assert sorted(r.turn for r in records) == list(range(16))


def test_a_worker_that_dies_is_replaced(served: tuple[Served, FakeUpstreamThread]) -> None:
    gateway, _ = served
    children = child_pids(gateway.process.pid)
    assert len(children) == 2
    os.kill(children[0], signal.SIGKILL)

    def replaced() -> bool:
        now = child_pids(gateway.process.pid)
        return len(now) == 2 and children[0] not in now

    eventually(replaced, "a new worker", timeout_seconds=30)
    seen: set[int] = set()

    def both_answer() -> bool:
        seen.update(gateway.workers_seen())
        return seen == {1, 2}

    eventually(both_answer, "both workers to answer", timeout_seconds=60)
    assert "starting another" in gateway.log.read_text()
    gateway.process.send_signal(signal.SIGINT)
    assert gateway.process.wait(timeout=60) == 130, gateway.log.read_text()


_OBSERVE = """
import sys
from types import SimpleNamespace
from reef.gateway.metrics import GatewayMetrics

stats = SimpleNamespace(
    queue_depth=0, written_total=0, batches_total=0, dropped_total=0,
    queue_full_total=0, failed_total=0,
)
activation = SimpleNamespace(
    flips_total=0,
    failures_total=0,
    status={},
    verifications=SimpleNamespace(failures_total=0, restaged_total=0),
    adapter_cache=SimpleNamespace(states={}),
)
metrics = GatewayMetrics(lambda: stats, lambda: activation)
for _ in range(int(sys.argv[1])):
    metrics.observe("chat.completions", 200, 0.01)
sys.stdout.write(metrics.render().decode())
"""


def test_metrics_of_separate_processes_add_up(tmp_path: Path) -> None:
    """Two processes on one PROMETHEUS_MULTIPROC_DIR: the later one's scrape counts
    both (what ``reef serve --workers`` sets up), even though the first has ended."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def observe(count: int) -> str:
        argv = [sys.executable, "-c", _OBSERVE, str(count)]
        return subprocess.run(argv, env=env, capture_output=True, check=True, text=True).stdout

    observe(3)
    scraped = observe(4)
    assert 'reef_requests_total{route="chat.completions",status="200"} 7.0' in scraped
    assert "reef_request_duration_seconds_count" in scraped
    assert "reef_capture_queue_depth" in scraped  # the process's own values still there

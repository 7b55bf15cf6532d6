"""A stream's receipt names a stored record from its headers on: the record is
``pending`` while the stream runs and its end writes the outcome over it."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

from reef.experience import RecordView
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread
from tests.polling import eventually


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstreamThread]:
    # Short slow streams: long enough to look at one mid-way, quick to read to the end.
    with FakeUpstreamThread(slow_chunks=20, slow_interval=0.01) as server:
        yield server


def _open_stream(
    gateway: GatewayThread, path: str, body: dict[str, object]
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    return conn, conn.getresponse()


def _finished(gateway: GatewayThread, record_id: str) -> RecordView:
    def outcome() -> RecordView | None:
        record = gateway.store.get_record(record_id)
        return None if record.status == "pending" else record

    return eventually(outcome, f"record {record_id} to leave pending", timeout_seconds=10)


@pytest.mark.parametrize(
    ("path", "model", "end"),
    [
        ("/v1/chat/completions", "reef/support", b"data: [DONE]"),
        ("/v1/messages", "reef/support", b"event: message_stop"),
    ],
)
def test_a_stream_is_pending_from_its_headers_then_finished_in_place(
    gateway: GatewayThread, path: str, model: str, end: bytes
) -> None:
    body = {
        "model": model,
        "stream": True,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "slow-stream"}],
    }
    conn, response = _open_stream(gateway, path, body)
    try:
        record_id = response.headers["x-reef-record-id"]
        assert response.readline()  # the stream has begun and is not over
        pending = gateway.store.get_record(record_id)
        assert pending.status == "pending"
        assert pending.response is None
        assert pending.request["messages"] == body["messages"]
        rest = response.read()
    finally:
        conn.close()
    assert end in rest
    done = _finished(gateway, record_id)
    assert done.status == "ok"
    assert done.response is not None
    assert (done.turn, done.created_at, done.session_id) == (
        pending.turn,
        pending.created_at,
        pending.session_id,
    )
    assert [r.id for r in gateway.store.get_session("support", done.session_id)] == [record_id]


def test_a_stream_the_client_leaves_finishes_its_pending_row_as_aborted(
    gateway: GatewayThread,
) -> None:
    body = {
        "model": "reef/support",
        "stream": True,
        "messages": [{"role": "user", "content": "slow-stream"}],
    }
    conn, response = _open_stream(gateway, "/v1/chat/completions", body)
    record_id = response.headers["x-reef-record-id"]
    assert gateway.store.get_record(record_id).status == "pending"
    conn.close()  # before reading a byte of the body
    record = _finished(gateway, record_id)
    assert record.status == "aborted"
    assert [r.id for r in gateway.store.get_session("support", record.session_id)] == [record_id]

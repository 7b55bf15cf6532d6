"""Upstream failures become 502/504 in the caller's dialect, and are recorded."""

from __future__ import annotations

import http.client
import json
import uuid

import anthropic
import openai
import pytest

from reef.experience import RecordFilter, RecordNotFoundError, RecordView
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread
from tests.polling import eventually


def oai(gateway: GatewayThread) -> openai.OpenAI:
    return gateway.openai()


def newest(gateway: GatewayThread, scenario: str = "support") -> RecordView:
    return gateway.store.list_records(scenario, RecordFilter(), None, 1).records[0]


def wait_for_record(gateway: GatewayThread, record_id: str) -> RecordView:
    """The record, once the gateway has stored its outcome (a stream's is ``pending``
    from its headers until it ends)."""

    def finished() -> RecordView | None:
        record = gateway.store.get_record(record_id)
        return None if record.status == "pending" else record

    return eventually(
        finished,
        f"record {record_id}",
        timeout_seconds=10,
        ignoring=(RecordNotFoundError,),
    )


def test_upstream_500_becomes_502_with_its_message(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    before = fake.requests_received("/v1/chat/completions")
    with pytest.raises(openai.APIStatusError) as info:
        oai(gateway).chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": "fail-500"}]
        )
    assert info.value.status_code == 502
    assert "fake upstream failure" in info.value.message
    # max_retries=2 in the test config: three attempts in all
    assert fake.requests_received("/v1/chat/completions") - before == 3
    record = newest(gateway)
    assert record.status == "error"
    assert record.error is not None and "fake upstream failure" in record.error
    assert info.value.response.headers["x-reef-record-id"] == record.id


def test_429_then_success_is_retried_transparently(gateway: GatewayThread) -> None:
    text = f"fail-429-once {uuid.uuid4()}"
    completion = oai(gateway).chat.completions.create(
        model="reef/support", messages=[{"role": "user", "content": text}]
    )
    assert completion.choices[0].message.content
    assert newest(gateway).status == "ok"


def test_500_once_then_success_is_retried(gateway: GatewayThread) -> None:
    text = f"fail-500-once {uuid.uuid4()}"
    completion = oai(gateway).chat.completions.create(
        model="reef/support", messages=[{"role": "user", "content": text}]
    )
    assert completion.choices[0].message.content


def test_client_errors_are_relayed_not_retried(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    before = fake.requests_received("/v1/chat/completions")
    with pytest.raises(openai.BadRequestError) as info:
        oai(gateway).chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": "bad-request"}]
        )
    assert info.value.status_code == 400
    assert fake.requests_received("/v1/chat/completions") - before == 1


def test_silent_upstream_becomes_504(gateway: GatewayThread) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        oai(gateway).chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": "hang"}]
        )
    assert info.value.status_code == 504
    # the upstream's 2 s read timeout ended the call, not the client's own timeout
    assert "sent nothing for 2" in info.value.message, info.value.message
    assert newest(gateway).status == "error"


def test_unreachable_upstream_is_502(make_gateway) -> None:  # type: ignore[no-untyped-def]
    gateway = make_gateway(
        upstreams={
            "down": {
                "type": "openai",
                "base_url": "http://127.0.0.1:9/v1",
                "model": "m",
                "max_retries": 1,
                "total_timeout_seconds": 5,
            }
        },
        scenarios={},
    )
    with pytest.raises(openai.APIStatusError) as info:
        oai(gateway).chat.completions.create(
            model="reef/x", messages=[{"role": "user", "content": "anyone?"}]
        )
    assert info.value.status_code == 502
    with pytest.raises(anthropic.APIStatusError) as ainfo:
        gateway.anthropic().messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "anyone?"}]
        )
    assert ainfo.value.status_code == 502
    assert ainfo.value.body["type"] == "error"  # type: ignore[index]


def test_drop_mid_stream_ends_with_an_error_event_and_is_recorded(gateway: GatewayThread) -> None:
    with oai(gateway).chat.completions.with_streaming_response.create(
        model="reef/support",
        messages=[{"role": "user", "content": "drop-mid-stream"}],
        stream=True,
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        with pytest.raises(openai.APIError):
            list(response.parse())
    record = wait_for_record(gateway, record_id)
    assert record.status == "error"


def test_client_disconnect_cancels_upstream_and_records_aborted(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    cancelled_before = fake.cancelled_streams
    body = {
        "model": "reef/support",
        "stream": True,
        "messages": [{"role": "user", "content": "slow-stream"}],
    }
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"}
    )
    response = conn.getresponse()
    record_id = response.headers["x-reef-record-id"]
    assert response.readline().startswith(b"data:")
    conn.close()  # hang up mid-stream
    # the client is gone: the gateway must cancel the upstream and record "aborted"
    record = wait_for_record(gateway, record_id)
    assert record.status == "aborted"
    eventually(
        lambda: fake.cancelled_streams > cancelled_before,
        "the upstream stream to be cancelled",
        timeout_seconds=10,
    )

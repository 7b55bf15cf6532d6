"""The hot path's shortcuts keep every guarantee: a request alone on the gateway has its
record written on the event loop (no writer-thread hand-off), yet its receipt names a
committed record as before, streamed or not; start-up objects are frozen out of the
cyclic garbage collector."""

from __future__ import annotations

import gc

from tests.gateway.harness import GatewayThread


def test_startup_objects_are_frozen(gateway: GatewayThread) -> None:
    assert gc.get_freeze_count() > 0


def test_a_lone_request_is_committed_before_its_answer(gateway: GatewayThread) -> None:
    client = gateway.openai()
    before = gateway.writer_stats.batches_total
    for number in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="reef/support", messages=[{"role": "user", "content": f"alone {number}"}]
        )
        record = gateway.store.get_record(raw.headers["x-reef-record-id"])
        assert record.status == "ok"
        assert record.request["messages"][0]["content"] == f"alone {number}"
    assert gateway.writer_stats.batches_total == before + 3  # one commit each


def test_a_lone_stream_is_committed_before_its_last_event(gateway: GatewayThread) -> None:
    client = gateway.openai()
    with client.chat.completions.with_streaming_response.create(
        model="reef/support", messages=[{"role": "user", "content": "stream alone"}], stream=True
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        text = "".join(
            chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices
        )
    record = gateway.store.get_record(record_id)
    assert record.status == "ok"
    assert record.response is not None
    assert record.response["choices"][0]["message"]["content"] == text

"""A stream is ``ok`` only when the upstream ended it properly.

Cut short, stalled past the read timeout, malformed or failed mid-way: the client's
stream ends with its dialect's error event (never ``[DONE]``, ``message_stop`` or an
invented stop reason) and the record is an ``error`` naming the reason. Every stream
goes through the three relays: OpenAI passthrough, Anthropic passthrough and Anthropic
translated from an OpenAI-compatible upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from reef.experience import RecordView
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

READ_TIMEOUT_SECONDS = 0.5
ENDS = [
    pytest.param("truncate-stream", "upstream_truncated", id="clean-end-without-terminal"),
    pytest.param("drop-mid-stream", "upstream_truncated", id="connection-dropped"),
    pytest.param("stall-stream", "upstream_stalled", id="stalled"),
    pytest.param("malformed-stream", "upstream_malformed", id="data-not-json"),
    pytest.param("malformed-sse", "upstream_malformed", id="not-sse"),
    pytest.param("error-mid-stream", "upstream_error", id="upstream-error-event"),
]
# (client dialect, scenario): "support" is the OpenAI-compatible fake, "claude" the
# Anthropic-dialect one; an Anthropic client on "support" is translated.
RELAYS = [
    pytest.param("openai", "support", id="openai"),
    pytest.param("anthropic", "claude", id="anthropic"),
    pytest.param("anthropic", "support", id="translated"),
]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, fake: FakeUpstreamThread
) -> Iterator[GatewayThread]:
    settings = make_settings(tmp_path_factory.mktemp("ends"), fake.base_url)
    for name, upstream in settings.upstreams.items():
        settings.upstreams[name] = upstream.model_copy(
            update={"read_timeout_seconds": READ_TIMEOUT_SECONDS}
        )
    with GatewayThread(settings) as running:
        yield running


def openai_stream(gateway: GatewayThread, text: str) -> tuple[str, list[Any], Exception | None]:
    """Stream through the OpenAI SDK: (record id, chunks, what iterating raised)."""
    chunks: list[Any] = []
    with gateway.openai().chat.completions.with_streaming_response.create(
        model="reef/support", messages=[{"role": "user", "content": text}], stream=True
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        try:
            for chunk in response.parse():
                chunks.append(chunk)
        except openai.APIError as exc:
            return record_id, chunks, exc
    return record_id, chunks, None


def anthropic_stream(
    gateway: GatewayThread, scenario: str, text: str
) -> tuple[str, list[Any], Exception | None]:
    """Stream through the Anthropic SDK: (record id, events, what iterating raised)."""
    events: list[Any] = []
    client = gateway.anthropic(**{"x-reef-scenario": scenario})
    with client.messages.with_streaming_response.create(
        model="claude-anything",
        max_tokens=64,
        messages=[{"role": "user", "content": text}],
        stream=True,
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        try:
            for event in response.parse():
                events.append(event)
        except anthropic.APIStatusError as exc:
            return record_id, events, exc
    return record_id, events, None


def stream(gateway: GatewayThread, dialect: str, scenario: str, text: str) -> Any:
    if dialect == "openai":
        return openai_stream(gateway, text)
    return anthropic_stream(gateway, scenario, text)


def assert_error_record(record: RecordView, reason: str) -> None:
    assert record.status == "error", record.error
    assert record.error is not None and record.error.startswith(reason + ":"), record.error


@pytest.mark.parametrize(("dialect", "scenario"), RELAYS)
@pytest.mark.parametrize(("behavior", "reason"), ENDS)
def test_a_stream_that_does_not_end_properly_ends_in_an_error(
    gateway: GatewayThread, dialect: str, scenario: str, behavior: str, reason: str
) -> None:
    record_id, received, error = stream(gateway, dialect, scenario, f"{behavior} please")
    assert error is not None, f"the client saw a proper end: {received[-3:]}"
    if dialect == "openai":
        assert isinstance(error, openai.APIError)
        assert error.message.startswith(reason + ":"), error.message
    else:
        assert isinstance(error, anthropic.APIStatusError)
        assert error.body["type"] == "error", error.body  # type: ignore[index]
        assert error.body["error"]["message"].startswith(reason + ":")  # type: ignore[index]
        kinds = [event.type for event in received]
        assert "message_stop" not in kinds and "message_delta" not in kinds, kinds
    # the record is committed before the error event goes out
    assert_error_record(gateway.store.get_record(record_id), reason)


@pytest.mark.parametrize(("dialect", "scenario"), RELAYS)
def test_a_cut_stream_keeps_what_was_received(
    gateway: GatewayThread, dialect: str, scenario: str
) -> None:
    record_id, _, error = stream(gateway, dialect, scenario, "truncate-stream")
    assert error is not None
    record = gateway.store.get_record(record_id)
    assert_error_record(record, "upstream_truncated")
    assert record.response is not None
    if dialect == "openai":
        assert record.response["choices"][0]["message"]["content"] == "echo: truncate-stream"
        assert record.response["choices"][0]["finish_reason"] is None
    else:
        assert record.response["content"][0]["text"] == "echo: truncate-stream"
        assert record.response["stop_reason"] is None  # none was sent, none is invented


@pytest.mark.parametrize(("dialect", "scenario"), RELAYS)
def test_a_proper_stream_is_still_ok(gateway: GatewayThread, dialect: str, scenario: str) -> None:
    record_id, received, error = stream(gateway, dialect, scenario, "all the way")
    assert error is None
    record = gateway.store.get_record(record_id)
    assert record.status == "ok" and record.error is None
    if dialect == "anthropic":
        assert received[-1].type == "message_stop"
        assert record.response is not None and record.response["stop_reason"] == "end_turn"

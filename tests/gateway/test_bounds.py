"""An upstream past one of its bounds, seen by the gateway's clients: a complete answer
too large is a 502 in the client's dialect naming ``max_response_bytes``; a stream
whose line never ends stops with the dialect's error event naming
``max_sse_line_bytes``, and the record says why; a call that found every connection
busy is a 503 with ``Retry-After``.

The upstream here floods without end (up to far past every bound), on real loopback
sockets, through the official SDKs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from reef.gateway.errors import error_response
from reef.upstream import UpstreamBusyError
from tests.fakes.loopback import LoopbackThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.test_stream_ends import assert_error_record, stream

LINE_LIMIT = 64 * 1024
BODY_LIMIT = 1024 * 1024
PIECE = b"x" * (64 * 1024)
ENOUGH = 32 * 1024 * 1024  # far past both bounds: a gateway still reading would get it
LONG_LINE = 9 * 1024 * 1024  # past the default line bound (8 MiB)
OPENAI_START = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}],
    }
)
ANTHROPIC_START = orjson.dumps(
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 1, "output_tokens": 0},
        },
    }
)


class FloodingUpstream(LoopbackThread):
    """Streams: one proper event, then a line that never ends. Complete answers: a body
    that never ends (chunked). Both stop when the gateway hangs up."""

    def __init__(self) -> None:
        super().__init__()
        self.finished = 0  # floods that went all the way to ``ENOUGH``

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._answer)
        app.router.add_post("/v1/messages", self._answer)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body["messages"][-1]["content"] == "one long line":
            return await self._long_line(request)
        anthropic_api = request.path == "/v1/messages"
        stream = bool(body.get("stream"))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream" if stream else "application/json"}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        if stream and anthropic_api:
            first = b"event: message_start\ndata: " + ANTHROPIC_START + b"\n\n"
            await response.write(first + b"event: content_block_delta\ndata: ")
        elif stream:
            await response.write(b"data: " + OPENAI_START + b"\n\ndata: ")
        sent = 0
        try:
            while sent < ENOUGH:
                await response.write(PIECE)
                sent += len(PIECE)
        except ConnectionError:
            return response
        self.finished += 1
        return response

    async def _long_line(self, request: web.Request) -> web.StreamResponse:
        """A proper stream whose one content delta is ``LONG_LINE`` characters."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta = {"index": 0, "delta": {"content": "y" * LONG_LINE}, "finish_reason": None}
        last = {"index": 0, "delta": {}, "finish_reason": "stop"}
        for choice in (delta, last):
            chunk = orjson.loads(OPENAI_START)
            chunk["choices"] = [choice]
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture(scope="module")
def flooding() -> Iterator[FloodingUpstream]:
    with FloodingUpstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, flooding: FloodingUpstream
) -> Iterator[GatewayThread]:
    settings = make_settings(tmp_path_factory.mktemp("bounds"), flooding.base_url)
    for name, upstream in settings.upstreams.items():
        settings.upstreams[name] = upstream.model_copy(
            update={"max_sse_line_bytes": LINE_LIMIT, "max_response_bytes": BODY_LIMIT}
        )
    with GatewayThread(settings) as running:
        yield running


def test_a_complete_answer_past_the_bound_is_a_502_naming_the_setting(
    gateway: GatewayThread, flooding: FloodingUpstream
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        gateway.openai().chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 502
    assert "upstreams.fake.max_response_bytes" in caught.value.message
    record_id = caught.value.response.headers["x-reef-record-id"]
    assert_error_record(gateway.store.get_record(record_id), "upstream_oversized")

    with pytest.raises(anthropic.APIStatusError) as refused:
        gateway.anthropic(**{"x-reef-scenario": "claude"}).messages.create(
            model="claude-anything", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.status_code == 502
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "api_error"
    assert "upstreams.claude.max_response_bytes" in error["message"]
    assert flooding.finished == 0


@pytest.mark.parametrize(
    ("dialect", "scenario", "upstream"),
    [
        pytest.param("openai", "support", "fake", id="openai"),
        pytest.param("anthropic", "claude", "claude", id="anthropic"),
        pytest.param("anthropic", "support", "fake", id="translated"),
    ],
)
def test_a_line_that_never_ends_ends_the_stream_with_an_error_event(
    gateway: GatewayThread, flooding: FloodingUpstream, dialect: str, scenario: str, upstream: str
) -> None:
    record_id, received, error = stream(gateway, dialect, scenario, "hi")
    assert received, "the event before the endless line was relayed"
    assert error is not None
    if dialect == "openai":
        assert isinstance(error, openai.APIError)
        message = error.message
    else:
        assert isinstance(error, anthropic.APIStatusError)
        message = error.body["error"]["message"]  # type: ignore[index]
    assert message.startswith("upstream_oversized:"), message
    assert f"upstreams.{upstream}.max_sse_line_bytes" in message
    assert_error_record(gateway.store.get_record(record_id), "upstream_oversized")
    assert flooding.finished == 0


@pytest.mark.parametrize(
    ("dialect", "kind"), [("openai", "service_unavailable"), ("anthropic", "overloaded_error")]
)
def test_a_busy_upstream_is_a_503_with_retry_after(dialect: str, kind: str) -> None:
    busy = UpstreamBusyError("all 2 connections (upstreams.fake.max_connections) stayed busy")
    response = error_response(busy, "openai" if dialect == "openai" else "anthropic")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    body = orjson.loads(response.body)
    assert body["error"]["type"] == kind
    assert "upstreams.fake.max_connections" in body["error"]["message"]


def test_a_raised_line_bound_holds_for_the_whole_relay(
    tmp_path: Path, flooding: FloodingUpstream
) -> None:
    """A line longer than the default bound passes when the upstream's bound is raised:
    the gateway's parser is sized by the upstream's setting, not its own default."""
    settings = make_settings(tmp_path, flooding.base_url)
    raised: dict[str, Any] = {"max_sse_line_bytes": 2 * LONG_LINE}
    settings.upstreams["fake"] = settings.upstreams["fake"].model_copy(update=raised)
    with GatewayThread(settings) as raised_gateway:
        record_id, received, error = stream(raised_gateway, "openai", "support", "one long line")
        assert error is None, error
        assert sum(len(chunk.choices[0].delta.content or "") for chunk in received) == LONG_LINE
        assert raised_gateway.store.get_record(record_id).status == "ok"

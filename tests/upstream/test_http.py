"""HTTPUpstream against the fake model server on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from reef.config.models import UpstreamConfig
from reef.core.errors import ReefError
from reef.upstream import (
    AdapterAlreadyLoadedError,
    HTTPUpstream,
    OpenAIStreamAssembler,
    SSEParser,
    UpstreamMalformedError,
    UpstreamRejectedError,
    UpstreamRequest,
    UpstreamStalledError,
    UpstreamTimeoutError,
    UpstreamTruncatedError,
    UpstreamUnavailableError,
    UpstreamUnsupportedError,
    build_upstream,
    error_message_from_body,
)
from tests.fakes.upstream import FakeUpstream
from tests.polling import eventually_async

CHAT = "/v1/chat/completions"


def config(base_url: str, **overrides: Any) -> UpstreamConfig:
    values: dict[str, Any] = {
        "type": "openai",
        "base_url": base_url,
        "api_key": "sk-upstream",
        "connect_timeout_seconds": 1.0,
        "read_timeout_seconds": 2.0,
        "total_timeout_seconds": 10.0,
        "max_retries": 2,
    }
    values.update(overrides)
    return UpstreamConfig(**values)


@pytest.fixture
async def upstream(fake: FakeUpstream) -> AsyncIterator[HTTPUpstream]:
    client = HTTPUpstream("fake", config(fake.base_url), backoff_seconds=0.01)
    try:
        yield client
    finally:
        await client.aclose()


def chat(text: str, *, stream: bool = False, **extra: Any) -> UpstreamRequest:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    body.update(extra)
    return UpstreamRequest("/chat/completions", orjson.dumps(body), stream)


class RecordedSleep:
    """The waits between attempts, recorded instead of slept (the clock stays put)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await asyncio.sleep(0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_send_forwards_body_headers_and_key(
    fake: FakeUpstream, upstream: HTTPUpstream
) -> None:
    request = chat("hello there")
    request = UpstreamRequest(
        request.path,
        request.body,
        False,
        {"X-Custom": "1", "Authorization": "Bearer client-key", "Content-Length": "999"},
    )
    response = await upstream.send(request)
    assert response.status == 200
    assert response.content_type.startswith("application/json")
    reply = orjson.loads(response.body)
    assert reply["choices"][0]["message"]["content"] == "echo: hello there"
    assert reply["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert fake.last_request_headers["authorization"] == "Bearer sk-upstream"
    assert fake.last_request_headers["x-custom"] == "1"
    assert fake.last_request_body == orjson.loads(request.body)


async def test_anthropic_dialect_headers(fake: FakeUpstream) -> None:
    client = HTTPUpstream("a", config(fake.base_url, type="anthropic"))
    try:
        body = {"model": "c", "max_tokens": 10, "messages": [{"role": "user", "content": "yo"}]}
        response = await client.send(UpstreamRequest("/messages", orjson.dumps(body), False))
        assert orjson.loads(response.body)["content"] == [{"type": "text", "text": "echo: yo"}]
        assert fake.last_request_headers["x-api-key"] == "sk-upstream"
        assert fake.last_request_headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in fake.last_request_headers
        assert await client.list_models() == ["fake-model"]
    finally:
        await client.aclose()


async def test_stream_yields_the_body_as_it_arrives(upstream: HTTPUpstream) -> None:
    stream = await upstream.open_stream(chat("one two three", stream=True))
    assert stream.status == 200
    assert stream.content_type.startswith("text/event-stream")
    parser = SSEParser()
    assembler = OpenAIStreamAssembler()
    done = False
    async for chunk in stream:
        for event in parser.feed(chunk):
            if event.data == "[DONE]":
                done = True
            else:
                assembler.feed(orjson.loads(event.data))
    await stream.aclose()
    await stream.aclose()  # idempotent
    result = assembler.result()
    assert done
    assert result["choices"][0]["message"]["content"] == "echo: one two three"
    assert result["usage"]["completion_tokens"] == 4


async def test_connection_is_reused(fake: FakeUpstream, upstream: HTTPUpstream) -> None:
    """Complete answers keep one connection alive (the lean client's), streams another
    (aiohttp's)."""
    for _ in range(5):
        await upstream.send(chat("x"))
    assert len(fake.peers) == 1
    for text in ("y", "w"):
        stream = await upstream.open_stream(chat(text, stream=True))
        async for _ in stream:
            pass
        await upstream.send(chat("z"))
    assert fake.requests[CHAT] == 9
    assert len(fake.peers) == 2


async def test_500_is_retried_then_502_with_the_upstream_message(
    fake: FakeUpstream, upstream: HTTPUpstream
) -> None:
    with pytest.raises(UpstreamUnavailableError) as caught:
        await upstream.send(chat("fail-500"))
    assert caught.value.status == 502
    assert caught.value.upstream_status == 500
    assert caught.value.message == "fake upstream failure (fail-500)"
    assert fake.requests[CHAT] == 3  # the first attempt and max_retries=2


@pytest.mark.parametrize("behavior", ["fail-500-once", "fail-429-once"])
async def test_one_failure_is_retried_to_success(
    fake: FakeUpstream, upstream: HTTPUpstream, behavior: str
) -> None:
    response = await upstream.send(chat(f"{behavior} req-1"))
    assert orjson.loads(response.body)["choices"][0]["message"]["content"].startswith("echo:")
    assert fake.requests[CHAT] == 2


async def test_stream_is_retried_before_the_first_byte(
    fake: FakeUpstream, upstream: HTTPUpstream
) -> None:
    stream = await upstream.open_stream(chat("fail-500-once req-2", stream=True))
    body = b"".join([chunk async for chunk in stream])
    assert body.endswith(b"data: [DONE]\n\n")
    assert fake.requests[CHAT] == 2


async def test_400_is_not_retried(fake: FakeUpstream, upstream: HTTPUpstream) -> None:
    with pytest.raises(UpstreamRejectedError) as caught:
        await upstream.open_stream(chat("bad-request", stream=True))
    assert (caught.value.status, caught.value.upstream_status) == (400, 400)
    assert caught.value.message == "fake upstream rejected the request (bad-request)"
    assert fake.requests[CHAT] == 1


async def test_501_is_not_retried_and_says_the_route_is_unsupported(
    fake: FakeUpstream, upstream: HTTPUpstream
) -> None:
    with pytest.raises(UpstreamUnsupportedError) as caught:
        await upstream.send(chat("fail-501"))
    assert (caught.value.status, caught.value.upstream_status) == (501, 501)
    assert "upstream 'fake' does not implement POST /chat/completions" in caught.value.message
    assert "fail-501" in caught.value.message
    assert fake.requests[CHAT] == 1


async def test_wrong_key_is_relayed_as_401() -> None:
    fake = FakeUpstream(api_key="right")
    await fake.start()
    client = HTTPUpstream("f", config(fake.base_url, api_key="wrong"))
    try:
        with pytest.raises(UpstreamRejectedError) as caught:
            await client.send(chat("hi"))
        assert caught.value.status == 401
    finally:
        await client.aclose()
        await fake.stop()


async def test_header_selects_the_behavior(fake: FakeUpstream, upstream: HTTPUpstream) -> None:
    request = chat("innocent")
    request = UpstreamRequest(request.path, request.body, False, {"x-fake-behavior": "fail-500"})
    with pytest.raises(UpstreamUnavailableError):
        await upstream.send(request)
    assert fake.requests[CHAT] == 3


async def test_hang_times_out_on_the_read_timeout(fake: FakeUpstream) -> None:
    client = HTTPUpstream("f", config(fake.base_url, read_timeout_seconds=0.3))
    try:
        with pytest.raises(UpstreamTimeoutError) as caught:
            await client.send(chat("hang"))
        # the read timeout fired, not the 10 s total deadline
        assert caught.value.message == "upstream 'f' sent nothing for 0.3s"
        assert caught.value.status == 504
        assert fake.requests[CHAT] == 1  # the upstream may be working on it: no retry
    finally:
        await client.aclose()


async def test_silence_mid_stream_is_a_stall(fake: FakeUpstream) -> None:
    fake.slow_interval = 1.0
    client = HTTPUpstream("f", config(fake.base_url, read_timeout_seconds=0.3))
    try:
        stream = await client.open_stream(chat("slow-stream", stream=True))
        with pytest.raises(UpstreamStalledError) as caught:
            async for _ in stream:
                pass
        assert caught.value.status == 504
        assert caught.value.detail.startswith("upstream_stalled: ")
        with pytest.raises(UpstreamStalledError):
            await client.send(chat("stall-body"))  # headers, half a body, then nothing
    finally:
        await client.aclose()


async def test_drop_mid_stream_is_truncated(upstream: HTTPUpstream) -> None:
    stream = await upstream.open_stream(chat("drop-mid-stream", stream=True))
    received = []
    with pytest.raises(UpstreamTruncatedError) as caught:
        async for chunk in stream:
            received.append(chunk)
    assert received  # the first chunks did arrive
    assert caught.value.status == 502
    with pytest.raises(UpstreamTruncatedError):
        await upstream.send(chat("drop-mid-stream"))


async def test_nothing_is_retried_after_the_first_byte(fake: FakeUpstream) -> None:
    sleep = RecordedSleep()
    client = HTTPUpstream("f", config(fake.base_url, max_retries=5), sleep=sleep)
    try:
        stream = await client.open_stream(chat("drop-mid-stream", stream=True))
        with pytest.raises(UpstreamTruncatedError):
            async for _ in stream:
                pass
        with pytest.raises(UpstreamTruncatedError):
            await client.send(chat("drop-mid-stream"))
        assert fake.requests[CHAT] == 2  # each call once, though five retries were allowed
        assert sleep.waits == []
    finally:
        await client.aclose()


async def test_retry_after_sets_the_wait_and_the_backoff_doubles_below_its_cap(
    fake: FakeUpstream,
) -> None:
    sleep = RecordedSleep()
    client = HTTPUpstream(
        "f", config(fake.base_url, max_retries=4), backoff_seconds=0.5, sleep=sleep
    )
    try:
        await client.send(chat("fail-503-once req-3"))  # Retry-After: 1
        assert sleep.waits == [1.0]
        with pytest.raises(UpstreamUnavailableError):
            await client.send(chat("fail-500"))  # no Retry-After: full jitter
        backoffs = sleep.waits[1:]
        assert len(backoffs) == 4
        assert all(0 <= wait <= 0.5 * 2**n for n, wait in enumerate(backoffs)), backoffs
    finally:
        await client.aclose()


async def test_a_stream_answered_with_another_content_type_is_malformed(
    fake: FakeUpstream, upstream: HTTPUpstream
) -> None:
    with pytest.raises(UpstreamMalformedError) as caught:
        await upstream.open_stream(chat("wrong-content-type", stream=True))
    assert "text/html" in caught.value.message
    assert fake.requests[CHAT] == 1  # a 200: not retried


async def test_aclose_mid_stream_cancels_the_upstream(
    fake: FakeUpstream, upstream: HTTPUpstream
) -> None:
    stream = await upstream.open_stream(chat("slow-stream", stream=True))
    chunks = 0
    async for _ in stream:
        chunks += 1
        if chunks == 2:
            break
    await stream.aclose()
    await eventually_async(lambda: fake.cancelled_streams, "the upstream to see the cancel")
    assert fake.cancelled_streams == 1
    assert fake.completed_streams == 0


async def test_connection_refused_is_retried_then_502() -> None:
    client = HTTPUpstream(
        "gone", config(f"http://127.0.0.1:{free_port()}/v1"), backoff_seconds=0.01
    )
    try:
        with pytest.raises(UpstreamUnavailableError) as caught:
            await client.send(chat("hi"))
        assert caught.value.status == 502
        assert "unreachable" in caught.value.message
    finally:
        await client.aclose()


async def test_connection_refused_then_up_succeeds_on_retry() -> None:
    port = free_port()
    client = HTTPUpstream(
        "late", config(f"http://127.0.0.1:{port}/v1", max_retries=8), backoff_seconds=0.1
    )
    fake = FakeUpstream()
    try:
        call = asyncio.create_task(client.send(chat("hi")))
        await asyncio.sleep(0.02)  # the first attempt is refused
        await fake.start(port=port)
        response = await call
        assert response.status == 200
    finally:
        await client.aclose()
        await fake.stop()


async def test_total_deadline_bounds_a_slow_body(fake: FakeUpstream) -> None:
    client = HTTPUpstream("f", config(fake.base_url, total_timeout_seconds=0.5))
    deadline = "upstream 'f' did not finish within 0.5s"
    try:
        # each chunk comes well within the 2 s read timeout: the total deadline ends it
        with pytest.raises(UpstreamTimeoutError) as caught:
            await client.send(chat("slow-stream"))
        assert caught.value.message == deadline
        with pytest.raises(UpstreamTimeoutError) as caught:
            stream = await client.open_stream(chat("slow-stream", stream=True))
            async for _ in stream:
                pass
        assert caught.value.message == deadline
    finally:
        await client.aclose()


async def test_total_deadline_stops_retrying(fake: FakeUpstream) -> None:
    sleep = RecordedSleep()
    client = HTTPUpstream(
        "f", config(fake.base_url, total_timeout_seconds=1.0, max_retries=5), sleep=sleep
    )
    try:
        with pytest.raises(UpstreamUnavailableError):
            await client.send(chat("fail-503-once req-4"))  # Retry-After: 1, past the deadline
        assert sleep.waits == []  # no wait that outlives the deadline
        assert fake.requests[CHAT] == 1
    finally:
        await client.aclose()


async def test_list_models(upstream: HTTPUpstream) -> None:
    assert await upstream.list_models() == ["fake-model"]


def test_build_upstream() -> None:
    built = build_upstream("u", config("http://127.0.0.1:1/v1/"))
    assert isinstance(built, HTTPUpstream)
    assert built.dialect == "openai"
    assert built.base_url == "http://127.0.0.1:1/v1"
    with pytest.raises(ReefError, match="embedded engine is not available in this build"):
        build_upstream("local", UpstreamConfig(type="local"))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "bad model", "type": "x"}}', "bad model"),
        (b'{"type": "error", "error": {"type": "x", "message": "overloaded"}}', "overloaded"),
        (b'{"object": "error", "message": "vllm says no"}', "vllm says no"),
        (b'{"detail": "not found"}', "not found"),
        (b'{"error": "plain"}', "plain"),
        (b"<html>oops</html>", "<html>oops</html>"),
        (b"", "upstream answered HTTP 503"),
    ],
)
def test_error_message_from_body(body: bytes, message: str) -> None:
    assert error_message_from_body(body, 503) == message


async def test_a_pooled_connection_poisoned_by_a_stale_read_timer_is_retried(
    fake: FakeUpstream, upstream: HTTPUpstream
) -> None:
    # aiohttp 3.14 can leave sock_read armed on a connection back in the pool (after a
    # large streamed answer); when it fires, the next request on it fails at once.
    # _on_read_timeout is what that stale timer calls. (Complete answers go through the
    # lean client; the model list, like streams, through aiohttp.)
    await upstream.list_models()
    session = upstream._session
    assert session is not None
    pooled = [item[0] for items in session.connector._conns.values() for item in items]  # type: ignore[union-attr]
    assert pooled
    for protocol in pooled:
        protocol._on_read_timeout()
    assert await upstream.list_models() == ["fake-model"]


async def test_an_adapter_name_served_already_is_its_own_error_type() -> None:
    server = FakeUpstream(adapters=True)
    await server.start()
    client = HTTPUpstream("fake", config(server.base_url), backoff_seconds=0.01)
    try:
        await client.load_adapter("support@abc", "/adapters/abc", None)
        # vLLM's 400 says so only in its message; the type says it to callers.
        with pytest.raises(AdapterAlreadyLoadedError) as info:
            await client.load_adapter("support@abc", "/adapters/abc", None)
        assert info.value.upstream_status == 400
        await client.unload_adapter("support@abc")
        await client.load_adapter("support@abc", "/adapters/abc", None)
        assert server.adapters == {"support@abc"}
    finally:
        await client.aclose()
        await server.stop()

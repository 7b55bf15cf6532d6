"""What an upstream can make the gateway hold is bounded: an event-stream line
(``max_sse_line_bytes``), an answer's body, complete or streamed (``max_response_bytes``),
and the connections open to it (``max_connections``).

Each test runs a hand-written HTTP/1.1 server on loopback that misbehaves without
limit (a line that never ends, a body that never stops) or holds its requests until the
test lets them go, and checks that the bound trips with the error that names its
setting, that what was held stayed within it, and that nothing waits past a deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from pydantic import ValidationError

from reef.upstream import (
    HTTPUpstream,
    SSEEvent,
    SSELineTooLongError,
    SSEParser,
    UpstreamBusyError,
    UpstreamOversizedError,
    h1,
)
from tests.polling import eventually_async
from tests.upstream.test_h1 import read_request
from tests.upstream.test_http import chat, config

LINE_LIMIT = 64 * 1024
BODY_LIMIT = 1024 * 1024
PIECE = 64 * 1024
# What a misbehaving server sends at most before it gives up: far past every bound and
# past what loopback sockets buffer (a few MiB), so a client that kept reading would
# get it all, and one that hung up stops it early.
ENOUGH = 32 * 1024 * 1024
EVENT_STREAM = "Content-Type: text/event-stream"

Answer = Callable[["Exchange"], Awaitable[None]]


class Exchange:
    """One request the server read, and its connection to answer it on."""

    def __init__(
        self,
        server: MisbehavingServer,
        request: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.server = server
        self.request = request
        self.reader = reader
        self.writer = writer

    async def write(self, data: bytes) -> bool:
        """Send ``data``; ``False`` once the client has hung up."""
        try:
            self.writer.write(data)
            await self.writer.drain()
        except ConnectionError:
            self.server.client_left.set()
            return False
        self.server.sent += len(data)
        return True

    async def flood(self, piece: bytes, frame: Callable[[bytes], bytes] = bytes) -> None:
        """Send ``piece`` (framed by ``frame``) again and again until the client hangs
        up or ``ENOUGH`` went out."""
        while self.server.sent < ENOUGH:
            if not await self.write(frame(piece)):
                return
        self.server.finished = True


class MisbehavingServer:
    """An HTTP/1.1 server on loopback that answers each request with ``answer``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.sent = 0  # bytes of answers written
        self.finished = False  # a flood went all the way to ``ENOUGH``
        self.client_left = asyncio.Event()
        self.arrived: asyncio.Queue[bytes] = asyncio.Queue()
        self.port = 0
        self._server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def requests(self, count: int) -> None:
        """Wait until ``count`` more requests have arrived."""
        async with asyncio.timeout(10):
            for _ in range(count):
                await self.arrived.get()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                request = await read_request(reader)
                self.arrived.put_nowait(request)
                await self.answer(Exchange(self, request, reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            self.client_left.set()
        finally:
            writer.close()


def head(*lines: str) -> bytes:
    return "".join(f"{line}\r\n" for line in ("HTTP/1.1 200 OK", *lines, "")).encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[MisbehavingServer]]]:
    servers: list[MisbehavingServer] = []

    async def start(answer: Answer) -> MisbehavingServer:
        server = MisbehavingServer(answer)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., HTTPUpstream]]:
    made: list[HTTPUpstream] = []

    def make(base_url: str, **overrides: Any) -> HTTPUpstream:
        values = {"max_sse_line_bytes": LINE_LIMIT, "max_response_bytes": BODY_LIMIT}
        client = HTTPUpstream("fake", config(base_url, **{**values, **overrides}))
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


# -- the event-stream line --------------------------------------------------------------


def test_the_parser_holds_no_more_of_an_unended_line_than_its_bound() -> None:
    parser = SSEParser(max_line_bytes=1000)
    assert parser.feed(b"data: first\n\ndata: ") == [SSEEvent(None, "first")]
    held = []
    with pytest.raises(SSELineTooLongError) as caught:
        for _ in range(100):
            parser.feed(b"x" * 100)
            held.append(parser.buffered)
    assert max(held) <= 1000
    assert held[-1] == 906  # "data: " and nine pieces: the tenth would pass the bound
    assert parser.buffered == 0  # dropped once refused
    assert "max_sse_line_bytes" in caught.value.message
    assert caught.value.status == 502


@pytest.mark.parametrize(
    "chunk_of",
    [
        pytest.param(lambda line: line, id="one-chunk"),
        pytest.param(lambda line: b"data: ok\r" + line, id="after-a-cr"),
    ],
)
def test_a_line_too_long_in_one_chunk_is_refused_and_one_at_the_bound_is_not(
    chunk_of: Callable[[bytes], bytes],
) -> None:
    at_bound = SSEParser(max_line_bytes=100)
    at_bound.feed(chunk_of(b"data: " + b"x" * 94))
    assert at_bound.buffered == 100
    assert at_bound.finish()[-1].data.endswith("x" * 94)
    with pytest.raises(SSELineTooLongError):
        SSEParser(max_line_bytes=100).feed(chunk_of(b"data: " + b"x" * 95))


async def endless_line(exchange: Exchange) -> None:
    if await exchange.write(head(EVENT_STREAM, "Connection: close")):
        await exchange.write(b'data: {"choices": []}\n\ndata: ')
        await exchange.flood(b"x" * PIECE)


async def test_a_stream_whose_line_never_ends_is_stopped_at_the_bound(
    serve: Callable[[Answer], Awaitable[MisbehavingServer]],
    clients: Callable[..., HTTPUpstream],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = await serve(endless_line)
    upstream = clients(server.base_url)
    stream = await upstream.open_stream(chat("hi", stream=True))
    parser = SSEParser(stream.max_line_bytes)
    events, held = [], []
    with pytest.raises(UpstreamOversizedError) as caught:
        async for piece in stream:
            events += parser.feed(piece)
            held.append(parser.buffered)
    assert events == [(None, '{"choices": []}')]  # what came before the line is relayed
    assert max(held) <= LINE_LIMIT  # the parser never held more than the bound
    assert caught.value.status == 502 and caught.value.reason == "upstream_oversized"
    assert "upstreams.fake.max_sse_line_bytes" in caught.value.message
    async with asyncio.timeout(10):
        await server.client_left.wait()  # the gateway hung up ...
    assert not server.finished  # ... long before the server was done
    assert "upstreams.fake.max_sse_line_bytes" in caplog.text
    assert any(r.name == "reef.upstream" and r.levelno == logging.WARNING for r in caplog.records)


async def test_a_raised_line_bound_lets_the_long_line_through(
    serve: Callable[[Answer], Awaitable[MisbehavingServer]],
    clients: Callable[..., HTTPUpstream],
) -> None:
    line = b'data: {"x": "' + b"y" * (2 * LINE_LIMIT) + b'"}\n\n'

    async def long_line(exchange: Exchange) -> None:
        await exchange.write(head(EVENT_STREAM, "Connection: close") + line)
        exchange.writer.close()

    server = await serve(long_line)
    upstream = clients(server.base_url, max_sse_line_bytes=4 * LINE_LIMIT)
    stream = await upstream.open_stream(chat("hi", stream=True))
    parser = SSEParser(stream.max_line_bytes)
    events = [event async for piece in stream for event in parser.feed(piece)]
    assert [len(event.data) for event in events] == [len(line) - len("data: \n\n")]


# -- the answer's body ------------------------------------------------------------------


def flood_with(*lines: str, frame: Callable[[bytes], bytes] = bytes) -> Answer:
    async def answer(exchange: Exchange) -> None:
        if await exchange.write(head(*lines)):
            await exchange.flood(b"x" * PIECE, frame)
        exchange.writer.close()

    return answer


BODIES = [
    pytest.param(flood_with(f"Content-Length: {ENOUGH}"), id="content-length"),
    pytest.param(flood_with("Transfer-Encoding: chunked", frame=chunk), id="chunked"),
    pytest.param(flood_with("Connection: close"), id="until-close"),
]


@pytest.mark.parametrize("answer", BODIES)
@pytest.mark.parametrize("client", ["h1", "aiohttp"])
async def test_a_body_past_the_bound_is_refused_without_reading_it_all(
    serve: Callable[[Answer], Awaitable[MisbehavingServer]],
    clients: Callable[..., HTTPUpstream],
    answer: Answer,
    client: str,
) -> None:
    server = await serve(answer)
    upstream = clients(server.base_url)
    with pytest.raises(UpstreamOversizedError) as caught:
        if client == "h1":  # a complete chat answer: the lean client
            await upstream.send(chat("hi"))
        else:  # the model list: aiohttp
            await upstream.list_models()
    assert caught.value.status == 502
    assert f"more than {BODY_LIMIT} bytes" in caught.value.message
    assert "upstreams.fake.max_response_bytes" in caught.value.message
    async with asyncio.timeout(10):
        await server.client_left.wait()
    assert not server.finished


async def test_a_body_announced_past_the_bound_is_refused_before_any_of_it(
    serve: Callable[[Answer], Awaitable[MisbehavingServer]],
) -> None:
    async def announce(exchange: Exchange) -> None:
        await exchange.write(head(f"Content-Length: {BODY_LIMIT + 1}"))
        await exchange.reader.read()  # not a byte of the body is sent: the client ends it
        exchange.server.client_left.set()

    server = await serve(announce)
    target = h1.Target.of(server.base_url)
    assert target is not None
    pool = h1.Pool(target, asyncio.get_running_loop(), max_body_bytes=BODY_LIMIT)
    with pytest.raises(h1.BodyTooLargeError) as caught:
        await pool.request("POST", "/x", b"{}", {}, h1.Limits(1.0, 10.0, 10.0))
    assert caught.value.announced == BODY_LIMIT + 1
    async with asyncio.timeout(10):
        await server.client_left.wait()


async def test_a_body_at_the_bound_is_read_whole(
    serve: Callable[[Answer], Awaitable[MisbehavingServer]],
    clients: Callable[..., HTTPUpstream],
) -> None:
    body = b'{"data": [{"id": "' + b"m" * (BODY_LIMIT - 22) + b'"}]}'
    assert len(body) == BODY_LIMIT

    async def whole(exchange: Exchange) -> None:
        await exchange.write(head("Transfer-Encoding: chunked") + chunk(body) + chunk(b""))

    server = await serve(whole)
    upstream = clients(server.base_url)
    assert (await upstream.send(chat("hi"))).body == body
    assert [len(name) for name in await upstream.list_models()] == [BODY_LIMIT - 22]


async def test_a_stream_past_the_body_bound_is_stopped(
    serve: Callable[[Answer], Awaitable[MisbehavingServer]],
    clients: Callable[..., HTTPUpstream],
) -> None:
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'

    async def endless_events(exchange: Exchange) -> None:
        if await exchange.write(head(EVENT_STREAM, "Connection: close")):
            await exchange.flood(event * 1000)

    server = await serve(endless_events)
    upstream = clients(server.base_url)
    stream = await upstream.open_stream(chat("hi", stream=True))
    received = 0
    with pytest.raises(UpstreamOversizedError) as caught:
        async for piece in stream:
            received += len(piece)
    assert received <= BODY_LIMIT
    assert "upstreams.fake.max_response_bytes" in caught.value.message
    async with asyncio.timeout(10):
        await server.client_left.wait()
    assert not server.finished


# -- connections ------------------------------------------------------------------------


def holding(release: asyncio.Event, *lines: str) -> Answer:
    """Answer each request once ``release`` is set (with ``lines`` as the head's and an
    event-stream's first event; else a small JSON body)."""

    async def answer(exchange: Exchange) -> None:
        if lines:  # a stream: its head and first event now, its end on release
            await exchange.write(head(*lines, "Transfer-Encoding: chunked"))
            await exchange.write(chunk(b'data: {"choices": []}\n\n'))
            await release.wait()
            await exchange.write(chunk(b"data: [DONE]\n\n") + chunk(b""))
            return
        await release.wait()
        body = b'{"data": [{"id": "m"}]}'
        await exchange.write(head(f"Content-Length: {len(body)}") + body)

    return answer


def with_deadline(upstream: HTTPUpstream, seconds: float) -> None:
    """The total deadline of the upstream's calls from now on."""
    upstream.config = upstream.config.model_copy(update={"total_timeout_seconds": seconds})


async def test_calls_past_the_connection_bound_wait_then_get_503(
    serve: Callable[[Answer], Awaitable[MisbehavingServer]],
    clients: Callable[..., HTTPUpstream],
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()
    server = await serve(holding(release))
    upstream = clients(server.base_url, max_connections=2, read_timeout_seconds=30.0)
    with_deadline(upstream, 30.0)
    held = [asyncio.create_task(upstream.send(chat(f"hold {n}"))) for n in range(2)]
    await server.requests(2)
    with_deadline(upstream, 0.2)  # the next call's: it cannot get a connection in time
    with pytest.raises(UpstreamBusyError) as caught:
        await upstream.send(chat("one too many"))
    assert caught.value.status == 503 and caught.value.retry_after_seconds >= 1
    assert "all 2 connections" in caught.value.message
    assert "upstreams.fake.max_connections" in caught.value.message
    assert "upstreams.fake.max_connections" in caplog.text
    assert server.connections == 2 and server.arrived.empty()  # it never reached the server

    with_deadline(upstream, 30.0)
    waiting = asyncio.create_task(upstream.send(chat("waits its turn")))
    await asyncio.sleep(0)  # it queues for a connection
    release.set()
    async with asyncio.timeout(10):
        answers = await asyncio.gather(*held, waiting)
    assert [answer.status for answer in answers] == [200, 200, 200]
    assert server.connections == 2  # the waiting call was handed a connection in use


async def test_streams_past_the_connection_bound_wait_then_get_503(
    serve: Callable[[Answer], Awaitable[MisbehavingServer]],
    clients: Callable[..., HTTPUpstream],
) -> None:
    release = asyncio.Event()
    server = await serve(holding(release, EVENT_STREAM))
    upstream = clients(server.base_url, max_connections=2)
    with_deadline(upstream, 30.0)
    streams = [await upstream.open_stream(chat(f"hold {n}", stream=True)) for n in range(2)]
    with_deadline(upstream, 0.2)
    with pytest.raises(UpstreamBusyError) as caught:  # aiohttp's pool, as streams use
        await upstream.open_stream(chat("one too many", stream=True))
    assert "upstreams.fake.max_connections" in caught.value.message
    assert server.connections == 2
    release.set()
    for stream in streams:
        assert b"[DONE]" in b"".join([piece async for piece in stream])


async def test_a_connection_that_fails_or_is_lost_frees_its_place(
    serve: Callable[[Answer], Awaitable[MisbehavingServer]],
) -> None:
    async def close_at_once(exchange: Exchange) -> None:
        exchange.writer.close()

    server = await serve(close_at_once)
    target = h1.Target.of(server.base_url)
    assert target is not None
    pool = h1.Pool(target, asyncio.get_running_loop(), max_connections=1)
    limits = h1.Limits(1.0, 10.0, 10.0)
    for _ in range(3):  # each lost connection frees its place for the next call
        with pytest.raises(h1.ConnectionLostError):
            await pool.request("POST", "/x", b"{}", {}, limits)
    # the last one's loss is seen on one of the loop's next turns
    await eventually_async(lambda: pool.open == 0, "the lost connection's place is free")
    await server.stop()
    for _ in range(3):  # a refused connection frees it too
        with pytest.raises(OSError):
            await pool.request("POST", "/x", b"{}", {}, limits)
    assert pool.open == 0


async def test_a_waiter_whose_deadline_passes_leaves_the_queue(
    serve: Callable[[Answer], Awaitable[MisbehavingServer]],
) -> None:
    release = asyncio.Event()
    server = await serve(holding(release))
    target = h1.Target.of(server.base_url)
    assert target is not None
    pool = h1.Pool(target, asyncio.get_running_loop(), max_connections=1)

    async def call(total: float) -> int:
        response = await pool.request("POST", "/x", b"{}", {}, h1.Limits(1.0, 30.0, total))
        await response.read()
        return response.status

    holder = asyncio.create_task(call(30.0))
    await server.requests(1)
    with pytest.raises(h1.PoolTimeoutError):
        await call(0.05)
    after = asyncio.create_task(call(30.0))
    await asyncio.sleep(0)
    release.set()
    async with asyncio.timeout(10):
        assert list(await asyncio.gather(holder, after)) == [200, 200]
    assert pool.open == 1 and server.connections == 1


def test_a_line_bound_past_the_body_bound_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"max_sse_line_bytes .* cannot exceed"):
        config(
            "http://127.0.0.1:1/v1",
            max_sse_line_bytes=2 * BODY_LIMIT,
            max_response_bytes=BODY_LIMIT,
        )

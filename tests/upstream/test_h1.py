"""The lean HTTP/1.1 client (``reef.upstream.h1``) against real servers on loopback: a
hand-written one for framings and failures aiohttp's server never sends, and the fake
model server through ``HTTPUpstream`` for the errors the gateway maps."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest

from reef.core.errors import InvalidInputError
from reef.upstream import (
    HTTPUpstream,
    UpstreamRequest,
    UpstreamStalledError,
    UpstreamTruncatedError,
    UpstreamUnavailableError,
    h1,
)
from tests.fakes.upstream import FakeUpstream
from tests.polling import eventually_async
from tests.upstream.test_http import chat, config


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 request, head and body (by its Content-Length), off ``reader``; raises
    ``asyncio.IncompleteReadError`` when the client leaves first."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


LIMITS = h1.Limits(connect=1.0, read=2.0, total=10.0)
BODY = b'{"ok": true}'


class Closing(bytes):
    """An answer after which the hand-written server closes the connection."""


class Resetting(bytes):
    """An answer after which the hand-written server resets the connection (RST)."""


class Parts(tuple[bytes, ...]):
    """An answer written in pieces, each flushed to the socket before the next."""


# What the hand-written server does with each request it reads: the bytes to answer
# (then keep reading on the connection, unless they are ``Closing``), or None to close
# it without a word.
Script = Callable[[int, bytes], Awaitable[bytes | None]]


class RawServer:
    """An HTTP/1.1 server written by hand, answering each request as ``script`` says
    (its index among all requests, and the request's bytes)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                request = await read_request(reader)
                index = len(self.requests)
                self.requests.append(request)
                answer = await self.script(index, request)
                if answer is None:
                    break
                for part in answer if isinstance(answer, Parts) else (answer,):
                    writer.write(part)
                    await writer.drain()
                if isinstance(answer, Resetting):
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    break
                if isinstance(answer, Closing):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client += 1
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[RawServer]]]:
    servers: list[RawServer] = []

    async def start(script: Script) -> RawServer:
        server = RawServer(script)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


def answer(body: bytes, *headers: str) -> bytes:
    head = "".join(f"{line}\r\n" for line in ("HTTP/1.1 200 OK", *headers))
    return head.encode() + b"\r\n" + body


def always(data: bytes) -> Script:
    async def script(index: int, request: bytes) -> bytes | None:
        return data

    return script


async def call(pool: h1.Pool, path: str = "/chat/completions") -> tuple[int, bytes]:
    response = await pool.request("POST", path, b"{}", {"content-type": "application/json"}, LIMITS)
    return response.status, await response.read()


def pool_for(server: RawServer) -> h1.Pool:
    target = h1.Target.of(server.base_url)
    assert target is not None
    return h1.Pool(target, asyncio.get_running_loop())


def test_only_plain_http_base_urls_are_served() -> None:
    target = h1.Target.of("http://models.internal:8000/v1/")
    assert target is not None
    assert (target.host, target.port, target.authority, target.prefix) == (
        "models.internal",
        8000,
        "models.internal:8000",
        "/v1",
    )
    ipv6 = h1.Target.of("http://[::1]/v1")
    assert ipv6 is not None
    assert (ipv6.host, ipv6.port, ipv6.authority) == ("::1", 80, "[::1]")
    for other in ("https://api.openai.com/v1", "http://user:pw@h/v1", "http://h/v1?x=1"):
        assert h1.Target.of(other) is None, other


@pytest.mark.parametrize(
    ("framing", "pooled"),
    [
        (answer(BODY, "Content-Type: application/json", f"Content-Length: {len(BODY)}"), True),
        (
            answer(b'5\r\n{"ok"\r\n7\r\n: true}\r\n0\r\n\r\n', "Transfer-Encoding: chunked"),
            True,
        ),
        (answer(BODY, f"Content-Length: {len(BODY)}", "Connection: close"), False),
    ],
    ids=["content-length", "chunked", "connection-close"],
)
async def test_each_framing_reads_the_whole_body_and_keeps_what_can_be_kept(
    serve: Callable[[Script], Awaitable[RawServer]], framing: bytes, pooled: bool
) -> None:
    server = await serve(always(framing))
    pool = pool_for(server)
    for _ in range(3):
        assert await call(pool) == (200, BODY)
    assert server.connections == (1 if pooled else 3)
    request = server.requests[0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in request
    assert b"Accept-Encoding: identity\r\n" in request  # nothing coded comes back
    assert b"Content-Length: 2\r\n\r\n{}" in request
    pool.close()


async def test_a_body_ended_by_the_close_is_whole(
    serve: Callable[[Script], Awaitable[RawServer]],
) -> None:
    # No Content-Length, not chunked: the body ends where the connection does.
    server = await serve(always(Closing(answer(BODY, "Content-Type: application/json"))))
    pool = pool_for(server)
    for _ in range(2):
        assert await call(pool) == (200, BODY)
    assert server.connections == 2  # such a connection cannot be kept
    pool.close()


async def test_a_kept_alive_connection_closed_upstream_is_retried_on_a_fresh_one(
    serve: Callable[[Script], Awaitable[RawServer]],
) -> None:
    framed = answer(BODY, "Content-Type: application/json", f"Content-Length: {len(BODY)}")

    async def script(index: int, request: bytes) -> bytes | None:
        return None if index == 1 else framed  # the second request: closed unanswered

    server = await serve(script)
    pool = pool_for(server)
    assert await call(pool) == (200, BODY)
    with pytest.raises(h1.StaleConnectionError):
        await call(pool)
    pool.close()

    # Through HTTPUpstream the same race costs a fresh connection, not an error.
    server.requests.clear()
    upstream = HTTPUpstream("raw", config(server.base_url, max_retries=1))
    try:
        assert (await upstream.send(chat("a"))).body == BODY
        answered = await upstream.send(chat("b"))
        assert (answered.status, answered.body) == (200, BODY)
        assert len(server.requests) == 3  # a, b (closed unanswered), b again
    finally:
        await upstream.aclose()


async def test_bytes_that_are_not_http_are_a_malformed_answer(
    serve: Callable[[Script], Awaitable[RawServer]],
) -> None:
    server = await serve(always(b"hello there\r\n\r\n"))
    upstream = HTTPUpstream("raw", config(server.base_url))
    try:
        with pytest.raises(UpstreamUnavailableError, match="malformed response"):
            await upstream.send(chat("x"))
        assert len(server.requests) == 1  # not retried: it would answer the same
    finally:
        await upstream.aclose()


async def test_a_body_cut_short_or_stalled_is_mapped_and_its_connection_dropped(
    fake: FakeUpstream,
) -> None:
    upstream = HTTPUpstream("fake", config(fake.base_url, read_timeout_seconds=0.3))
    try:
        with pytest.raises(UpstreamTruncatedError):
            await upstream.send(_behaving("drop-mid-stream"))
        with pytest.raises(UpstreamStalledError):
            await upstream.send(_behaving("stall-body"))
        fake.release_held()
        answered = await upstream.send(chat("after"))
        content = orjson.loads(answered.body)["choices"][0]["message"]["content"]
        assert content == "echo: after"
        assert len(fake.peers) == 3  # each failure's connection was dropped, not reused
    finally:
        await upstream.aclose()


async def test_a_cancelled_call_closes_its_connection(
    serve: Callable[[Script], Awaitable[RawServer]],
) -> None:
    held = asyncio.Event()
    framed = answer(BODY, f"Content-Length: {len(BODY)}")

    async def script(index: int, request: bytes) -> bytes | None:
        if index == 0:
            held.set()
            await asyncio.Event().wait()  # never answers; cancelled when the server stops
        return framed

    server = await serve(script)
    pool = pool_for(server)
    first = asyncio.create_task(call(pool))
    await held.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await call(pool) == (200, BODY)
    assert server.connections == 2  # the cancelled call's connection was not reused
    pool.close()


async def test_idle_connections_expire(
    serve: Callable[[Script], Awaitable[RawServer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await serve(always(answer(BODY, f"Content-Length: {len(BODY)}")))
    pool = pool_for(server)
    assert await call(pool) == (200, BODY)
    monkeypatch.setattr(h1, "KEEPALIVE_SECONDS", -1.0)  # every idle one has expired
    assert await call(pool) == (200, BODY)
    assert server.connections == 2
    await eventually_async(lambda: server.closed_by_client >= 1 or None, "the expired one closed")
    pool.close()


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(
    serve: Callable[[Script], Awaitable[RawServer]],
) -> None:
    server = await serve(always(answer(BODY, f"Content-Length: {len(BODY)}")))
    pool = pool_for(server)
    with pytest.raises(h1.InvalidHeaderError):
        await pool.request("POST", "/x", b"{}", {"x-a": "one\r\nx-b: two"}, LIMITS)
    upstream = HTTPUpstream("raw", config(server.base_url, api_key="sk-\nbad"))
    try:
        with pytest.raises(InvalidInputError, match="cannot be sent upstream"):
            await upstream.send(chat("x"))
    finally:
        await upstream.aclose()
    assert server.requests == []


def _behaving(behavior: str) -> UpstreamRequest:
    request = chat("x")
    return UpstreamRequest(request.path, request.body, False, {"x-fake-behavior": behavior})


FRAMED = answer(BODY, "Content-Type: application/json", f"Content-Length: {len(BODY)}")


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 100 Continue\r\n\r\n" + FRAMED,
        Parts((b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n", FRAMED)),
    ],
    ids=["one-write", "two-writes"],
)
async def test_an_informational_answer_is_skipped_for_the_real_one(
    serve: Callable[[Script], Awaitable[RawServer]], interim: bytes
) -> None:
    second = answer(b"second", "Content-Length: 6")

    async def script(index: int, request: bytes) -> bytes | None:
        return interim if index == 0 else second

    server = await serve(script)
    pool = pool_for(server)
    assert await call(pool) == (200, BODY)
    assert await call(pool) == (200, b"second")  # not the first answer's leftovers
    assert server.connections == 1
    pool.close()


async def test_bytes_past_the_answer_are_dropped_with_their_connection(
    serve: Callable[[Script], Awaitable[RawServer]],
) -> None:
    extra = answer(b"bogus!", "Content-Length: 6")
    server = await serve(always(FRAMED + extra))
    pool = pool_for(server)
    for _ in range(2):
        assert await call(pool) == (200, BODY)
    assert server.connections == 2  # what followed the answer made it unusable
    pool.close()


async def test_a_reset_in_a_body_framed_by_the_close_is_not_a_whole_body(
    serve: Callable[[Script], Awaitable[RawServer]],
) -> None:
    server = await serve(always(Resetting(answer(BODY[:5]))))
    upstream = HTTPUpstream("raw", config(server.base_url))
    try:
        with pytest.raises(UpstreamTruncatedError):
            await upstream.send(chat("x"))
    finally:
        await upstream.aclose()


async def test_a_switch_of_protocols_is_a_malformed_answer(
    serve: Callable[[Script], Awaitable[RawServer]],
) -> None:
    switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
    server = await serve(always(switch))
    upstream = HTTPUpstream("raw", config(server.base_url))
    try:
        with pytest.raises(UpstreamUnavailableError, match="malformed response"):
            await upstream.send(chat("x"))
    finally:
        await upstream.aclose()


async def test_a_repeated_header_reads_as_its_first_value(
    serve: Callable[[Script], Awaitable[RawServer]],
) -> None:
    twice = answer(
        BODY, "Content-Type: application/json", "Content-Type: text/plain", "Content-Length: 12"
    )
    server = await serve(always(twice))
    pool = pool_for(server)
    response = await pool.request("POST", "/x", b"{}", {}, LIMITS)
    assert response.headers.get("content-type") == "application/json"
    assert await response.read() == BODY
    pool.close()

"""A lean HTTP/1.1 client for the gateway's hot path: complete (non-streaming) calls to a
plain-HTTP upstream over keep-alive connections.

On the reference machine aiohttp's client spends ~110-150 µs of CPU on one small call
(request and response objects, a payload registry, three timers, cookie and trace
hooks); at concurrency 32 that is a quarter of the gateway's CPU per request. This one
is a pool of asyncio protocols over httptools' parser (the parser uvicorn serves with),
about 40 µs a call, and does only what that path needs: a request with a body of bytes;
an answer framed by ``Content-Length``, chunked, or ended by the connection's close;
keep-alive with an idle expiry; connect, read and total timeouts; 1xx answers skipped
and a 101 refused. It asks for answers uncoded (``Accept-Encoding: identity``). Idle
connections are pruned when the pool is used, not on a timer. Everything it holds is
bounded: at most ``max_connections`` connections are open (idle ones included; a call
that finds them all busy waits for one, first come first served, within its total
deadline), and at most ``max_body_bytes`` of an answer's body are kept. TLS, proxies,
redirects, cookies, compression and streamed answers stay with aiohttp
(``reef.upstream.http``), which also owns retries and the mapping of these errors.

Errors, all raised by ``Pool.request`` or ``Response.read``:

- ``ConnectTimeoutError``: no connection within the connect timeout.
- ``ReadTimeoutError``: nothing arrived for the read timeout (``began``: after the
  answer's headers).
- ``TimeoutError``: the total deadline passed.
- ``StaleConnectionError``: a kept-alive connection was closed before any of the answer
  arrived (the upstream closed it as it idled); a fresh connection may be tried at once.
- ``ConnectionLostError`` (and the ``OSError`` of a failed connect): the connection
  failed otherwise.
- ``MalformedResponseError``: what arrived is not HTTP/1.1.
- ``BodyTooLargeError``: the body is (or announces itself) larger than ``max_body_bytes``.
- ``PoolTimeoutError``: every connection stayed busy until the total deadline.
- ``InvalidHeaderError``: a header to send holds a line break (nothing was sent).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Final, NamedTuple
from urllib.parse import urlsplit

import httptools

# Idle connections are dropped after this long, before the servers upstreams usually run
# on (uvicorn: 5 s) close them under a request.
KEEPALIVE_SECONDS: Final = 4.0
# The pool's defaults; the gateway passes each upstream's own settings.
MAX_CONNECTIONS: Final = 256
MAX_BODY_BYTES: Final = 64 * 1024 * 1024
_NO_BODY: Final = frozenset({204, 304})
_LINE_BREAKS: Final = ("\r", "\n", "\0")


class ConnectTimeoutError(TimeoutError):
    """No connection within the connect timeout; nothing was sent."""


class ReadTimeoutError(TimeoutError):
    """Nothing arrived for the read timeout; ``began``: the answer's headers had."""

    def __init__(self, message: str, *, began: bool) -> None:
        super().__init__(message)
        self.began = began


class ConnectionLostError(ConnectionError):
    """The connection closed or failed before the answer was complete."""


class StaleConnectionError(ConnectionLostError):
    """A kept-alive connection closed before any of the answer arrived."""


class MalformedResponseError(Exception):
    """The upstream's bytes are not a valid HTTP/1.1 answer."""


class BodyTooLargeError(Exception):
    """The answer's body passed ``limit`` bytes (``announced``: its ``Content-Length``,
    when that said so before any of it was read)."""

    def __init__(self, limit: int, announced: int | None = None) -> None:
        size = f"of {announced} bytes" if announced is not None else "larger than that"
        super().__init__(f"the answer's body is limited to {limit} bytes; it is {size}")
        self.limit = limit
        self.announced = announced


class PoolTimeoutError(TimeoutError):
    """All ``limit`` connections stayed busy until the call's total deadline; nothing
    was sent."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"all {limit} connections stayed busy until the deadline")
        self.limit = limit


class InvalidHeaderError(ValueError):
    """A request header that cannot be sent: a line break or NUL in it."""


class Limits(NamedTuple):
    """An exchange's timeouts, in seconds: to connect, between reads, and in all (the
    body's reading included)."""

    connect: float
    read: float
    total: float


class Headers(dict[str, str]):
    """An answer's headers by lower-cased name; ``get`` takes any case."""

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(name.lower(), default)


class Target:
    """Where a base URL's calls go: ``http://host[:port][/prefix]`` only."""

    def __init__(self, host: str, port: int, authority: str, prefix: str) -> None:
        self.host = host
        self.port = port
        self.authority = authority  # the Host header
        self.prefix = prefix  # the base URL's path, joined before each call's

    @classmethod
    def of(cls, base_url: str) -> Target | None:
        """The target of ``base_url``, or ``None`` when this client does not serve it
        (not plain ``http``, or with credentials, a query or a fragment in it)."""
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            return None
        if parts.username is not None or parts.password is not None:
            return None
        if parts.query or parts.fragment:
            return None
        try:
            port = parts.port or 80
        except ValueError:
            return None
        return cls(parts.hostname, port, parts.netloc, parts.path.rstrip("/"))


class Response:
    """An answer whose status and headers have arrived; ``read`` waits for its body."""

    def __init__(self, connection: _Connection, status: int, headers: Headers) -> None:
        self.status = status
        self.headers = headers
        self._connection: _Connection | None = connection
        self._body: bytes | None = None

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool (or is closed)."""
        if self._body is not None:
            return self._body
        connection, self._connection = self._connection, None
        if connection is None:
            raise ConnectionLostError("the answer was closed before its body was read")
        self._body = await connection.body()
        return self._body

    def close(self) -> None:
        """Let go of the connection without reading the rest: it is closed unless the
        answer was complete. Idempotent."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.abandon()


class _Connection(asyncio.Protocol):
    """One keep-alive connection, answering one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.idle_since = 0.0
        self.closed = False
        self.served = 0  # answers completed on this connection
        self._holds_slot = True  # counted in the pool's ``open`` until it is lost
        self._reset()

    def _reset(self) -> None:
        self._busy = False
        self._received = False
        self._header_names: list[bytes] = []
        self._header_values: list[bytes] = []
        self._headers: Headers | None = None
        self._chunks: list[bytes] = []
        self._size = 0  # bytes of the body so far
        self._head: asyncio.Future[Response] | None = None
        self._done: asyncio.Future[bytes] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0
        self._read_timeout = 0.0
        self._deadline = 0.0
        self._keep = False
        self._complete = False
        self._error: BaseException | None = None
        self._interim = False  # parsing a 1xx answer, which precedes the real one
        self._trailing = False  # parsing bytes after the answer's end

    # -- asyncio.Protocol ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self._busy or self._complete:
            # Bytes nobody asked for (past the answer's end): this connection is unusable.
            self._keep = False
            self._close()
            return
        self._received = True
        self._last = self._loop.time()
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self._complete:  # garbage after a whole answer: keep it, not the connection
                self._keep = False
                self._close()
            else:
                self._fail(MalformedResponseError(f"invalid HTTP answer: {exc!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.free_slot()
        if not self._busy or self._complete:
            return
        if exc is None and self._headers is not None and self._until_close():
            self._finish()  # a clean close ends a body with no other framing
            return
        reason = f": {exc}" if exc else ""
        if not self._received and self.served:
            self._fail(StaleConnectionError(f"a kept-alive connection was closed{reason}"))
        else:
            self._fail(ConnectionLostError(f"the upstream closed the connection{reason}"))

    # -- httptools callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:  # a second answer to one request: ignored, never pooled
            self._trailing = True
            self._keep = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._trailing:
            self._header_names.append(name)
            self._header_values.append(value)

    def on_headers_complete(self) -> None:
        if self._trailing:
            return
        names, values = self._header_names, self._header_values
        self._header_names, self._header_values = [], []
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # 100 Continue, 103 Early Hints
            self._interim = True
            return
        if status == 101:
            self._fail(MalformedResponseError("the upstream switched protocols (101)"))
            return
        headers = Headers()
        for name, value in zip(names, values, strict=True):
            # The first of a repeated header, as aiohttp's ``get`` gives it.
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        announced = _content_length(headers)
        if announced is not None and announced > self._pool.max_body_bytes:
            self._fail(BodyTooLargeError(self._pool.max_body_bytes, announced))
            return
        self._headers = headers
        head = self._head
        if head is not None and not head.done():
            head.set_result(Response(self, status, headers))

    def on_body(self, body: bytes) -> None:
        if self._trailing or self._complete:  # past the answer, or it failed
            return
        self._size += len(body)
        if self._size > self._pool.max_body_bytes:
            self._chunks = []  # not kept: the answer fails
            self._fail(BodyTooLargeError(self._pool.max_body_bytes))
            return
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self._trailing:
            return
        if self._interim:
            self._interim = False
            return
        self._keep = self._parser.should_keep_alive()
        self._finish()

    # -- one exchange --------------------------------------------------------------

    def send(
        self, request: bytes, read_timeout: float, deadline: float
    ) -> asyncio.Future[Response]:
        """Write ``request``; the future has the answer once its headers are in."""
        self._reset()
        self._busy = True
        self._head = self._loop.create_future()
        self._read_timeout = read_timeout
        self._deadline = deadline
        self._last = self._loop.time()
        self._timer = self._loop.call_at(min(deadline, self._last + read_timeout), self._check)
        transport = self._transport
        if transport is None or transport.is_closing():
            self._fail(StaleConnectionError("a kept-alive connection was closed"))
        else:
            transport.write(request)
        return self._head

    async def body(self) -> bytes:
        """The answer's body once complete (or its exchange's error); the connection
        is released either way."""
        try:
            if not self._complete:
                self._done = self._loop.create_future()
                await self._done
            if self._error is not None:
                raise self._error
            return b"".join(self._chunks)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """End the exchange: a complete answer's connection goes back to the pool, an
        incomplete one is closed (what is left of its answer is never read)."""
        if not self._busy:
            return
        if not self._complete:
            self._fail(ConnectionLostError("the answer was left before its end"))
        self._release()

    def _release(self) -> None:
        """Back to the pool when kept alive and done; closed otherwise."""
        keep = self._keep and self._complete and not self.closed
        self._reset()
        if keep:
            self.served += 1
            self._pool.release(self)
        else:
            self._close()

    def _until_close(self) -> bool:
        headers = self._headers
        if headers is None or self._parser.get_status_code() in _NO_BODY:
            return False
        chunked = "chunked" in (headers.get("transfer-encoding") or "").lower()
        return "content-length" not in headers and not chunked

    def _finish(self) -> None:
        self._complete = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        head = self._head
        if head is not None and not head.done():  # no headers callback: not possible
            self._fail(MalformedResponseError("an answer without headers"))
            return
        done = self._done
        if done is not None and not done.done():
            done.set_result(b"")

    def _check(self) -> None:
        """The one timer of an exchange: the total deadline, or the read timeout since
        the last bytes (re-armed while bytes keep coming)."""
        self._timer = None
        if not self._busy or self._complete:
            return
        now = self._loop.time()
        if now >= self._deadline:
            self._fail(TimeoutError("the total deadline passed"))
        elif now - self._last >= self._read_timeout:
            began = self._headers is not None
            self._fail(ReadTimeoutError(f"nothing for {self._read_timeout}s", began=began))
        else:
            when = min(self._deadline, self._last + self._read_timeout)
            self._timer = self._loop.call_at(when, self._check)

    def _fail(self, exc: BaseException) -> None:
        """End the exchange with ``exc`` for whoever waits; the connection is closed."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._complete = True
        self._keep = False
        self._error = exc  # for a body read that comes later
        for waiter in (self._head, self._done):
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)
        self._close()

    def _close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def free_slot(self) -> None:
        """No longer count against the pool's limit (once: it is lost, or it never
        connected)."""
        if self._holds_slot:
            self._holds_slot = False
            self._pool.slot_freed()


def _content_length(headers: Headers) -> int | None:
    value = headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


class Pool:
    """Keep-alive connections to one ``Target``, for one event loop: at most
    ``max_connections`` open, answers' bodies of at most ``max_body_bytes``."""

    def __init__(
        self,
        target: Target,
        loop: asyncio.AbstractEventLoop,
        *,
        max_connections: int = MAX_CONNECTIONS,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.target = target
        self.loop = loop
        self.max_connections = max_connections
        self.max_body_bytes = max_body_bytes
        self.open = 0  # connections open or being opened, idle ones included
        self._idle: collections.deque[_Connection] = collections.deque()
        # Calls waiting for a connection, first come first served: each is handed an idle
        # connection, or ``None``, the right to open one (a slot freed by a lost one).
        self._waiters: collections.deque[asyncio.Future[_Connection | None]] = collections.deque()
        self._closed = False

    async def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], limits: Limits
    ) -> Response:
        """Send one request; the answer once its status and headers have arrived.

        Only for methods whose answers carry a body as framed (not ``HEAD``).
        """
        if method == "HEAD":
            raise ValueError("h1 does not send HEAD: its answer's framing differs")
        deadline = self.loop.time() + limits.total
        request = self._encode(method, path, body, headers)
        connection = await self._acquire(deadline)
        if connection is None:
            remaining = deadline - self.loop.time()
            try:
                connection = await self._connect(min(limits.connect, remaining))
            except ConnectTimeoutError as exc:
                if remaining <= limits.connect:
                    raise TimeoutError("the total deadline passed") from exc
                raise
        head = connection.send(request, limits.read, deadline)
        try:
            return await head
        except BaseException:
            connection.abandon()
            raise

    def release(self, connection: _Connection) -> None:
        """Take back a connection whose answer is complete: to the first waiting call,
        else to the idle ones."""
        if self._closed:
            connection._close()
            return
        if self._hand_over(connection):
            return
        now = self.loop.time()
        connection.idle_since = now
        self._idle.append(connection)
        idle = self._idle
        # The stack is used from its top, so expired ones gather at its bottom.
        while idle and (idle[0].closed or now - idle[0].idle_since > KEEPALIVE_SECONDS):
            idle.popleft()._close()

    def close(self) -> None:
        """Close every idle connection; ones in use close when their answer is done.
        Calls waiting for a connection fail."""
        self._closed = True
        while self._idle:
            self._idle.pop()._close()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionLostError("the pool was closed"))

    def slot_freed(self) -> None:
        """A connection is gone (or was never made): its place goes to the first waiting
        call, which opens one, or is free."""
        if not self._hand_over(None):
            self.open -= 1

    def _hand_over(self, connection: _Connection | None) -> bool:
        """Give ``connection`` (or, ``None``, the right to open one) to the first call
        still waiting; whether there was one."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return True
        return False

    async def _acquire(self, deadline: float) -> _Connection | None:
        """An idle connection, or ``None`` when a new one may be opened (its place is
        counted already); waits while ``max_connections`` are open, until ``deadline``
        (raising ``PoolTimeoutError``)."""
        connection = self._idle_connection()
        if connection is not None:
            return connection
        if self.open < self.max_connections:
            self.open += 1
            return None
        waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                return await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back(waiter.result())  # handed over just as the wait ended
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):  # gone when handed an exception
                    self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise PoolTimeoutError(self.max_connections) from exc
            raise

    def _give_back(self, connection: _Connection | None) -> None:
        if connection is None:
            self.slot_freed()
        else:
            self.release(connection)

    def _idle_connection(self) -> _Connection | None:
        idle = self._idle
        now = self.loop.time()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since <= KEEPALIVE_SECONDS:
                return connection
            connection._close()
        return None

    async def _connect(self, seconds: float) -> _Connection:
        """A new connection, in the place ``_acquire`` counted for it; that place is
        freed if it fails."""
        target = self.target
        made: list[_Connection] = []

        def protocol() -> _Connection:
            made.append(_Connection(self))
            return made[-1]

        try:
            async with asyncio.timeout(seconds):
                _, connection = await self.loop.create_connection(
                    protocol, target.host, target.port
                )
        except BaseException as exc:
            if made:
                made[-1].free_slot()
            else:
                self.slot_freed()
            if isinstance(exc, TimeoutError):
                raise ConnectTimeoutError(f"no connection within {seconds}s") from exc
            raise
        return connection

    def _encode(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> bytes:
        target = self.target
        lines = [
            f"{method} {target.prefix}{path} HTTP/1.1\r\nHost: {target.authority}\r\n"
            "Accept-Encoding: identity\r\n"  # absent would allow any coding; none is decoded
        ]
        for name, value in headers.items():
            if any(mark in name or mark in value for mark in _LINE_BREAKS):
                raise InvalidHeaderError(f"header {name!r} holds a line break or NUL")
            lines.append(f"{name}: {value}\r\n")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}\r\n")
        lines.append("\r\n")
        text = "".join(lines)
        try:
            head = text.encode("latin-1")
        except UnicodeEncodeError:
            head = text.encode("utf-8")
        return head + body if body else head

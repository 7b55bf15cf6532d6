"""HTTP upstreams: OpenAI-compatible servers and the Anthropic API.

This is the gateway's hot path, so a call does as little as possible. A complete
(non-streaming) call to a plain-``http`` upstream goes through ``reef.upstream.h1``, a
lean keep-alive client; streams, ``https`` and the admin routes go through one pooled
aiohttp ``ClientSession`` per upstream. Both are created lazily inside the running
loop; headers are precomputed at construction. Retries and the mapping of failures to
``UpstreamError`` are the same for both.

What an upstream can make the gateway hold is bounded by its settings: each pool opens
at most ``max_connections`` (a call waits for a free one within its total deadline,
then ``UpstreamBusyError``), a body is read up to ``max_response_bytes``, a stream
passes at most ``max_response_bytes`` in all and no line longer than
``max_sse_line_bytes`` (``UpstreamOversizedError`` past either); each is logged.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import Any, Final, Literal, Protocol, TypeVar, overload

import aiohttp

from reef.config.models import UpstreamConfig
from reef.core.errors import InvalidInputError, ReefError
from reef.core.jsoncodec import dumps, loads
from reef.core.retrying import Retrier, RetryPolicy, Sleep, parse_retry_after
from reef.upstream import h1
from reef.upstream.base import (
    ADAPTER_ALREADY_LOADED,
    AdapterAlreadyLoadedError,
    Dialect,
    Upstream,
    UpstreamBusyError,
    UpstreamError,
    UpstreamMalformedError,
    UpstreamOversizedError,
    UpstreamRejectedError,
    UpstreamRequest,
    UpstreamResponse,
    UpstreamStalledError,
    UpstreamStream,
    UpstreamTimeoutError,
    UpstreamTruncatedError,
    UpstreamUnavailableError,
    UpstreamUnsupportedError,
)

# Hop-by-hop and framing headers describe the client's connection to the gateway,
# not the gateway's connection upstream; the credentials are the upstream's own.
_NOT_FORWARDED: Final = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
    }
)
# Uvicorn (vLLM, SGLang) closes idle connections after 5 s; reusing one it is just
# closing fails the request, so ours expire first.
_KEEPALIVE_SECONDS: Final = h1.KEEPALIVE_SECONDS
_BACKOFF_CAP_SECONDS: Final = 8.0
_ERROR_TEXT_LIMIT: Final = 500
_EVENT_STREAM: Final = "text/event-stream"
_VLLM_ALREADY_LOADED: Final = re.compile(r"has already been loaded", re.IGNORECASE)

log = logging.getLogger("reef.upstream")


_Capped = TypeVar("_Capped", bound=UpstreamError)
_READ_TIMEOUTS: Final = (
    aiohttp.SocketTimeoutError,
    aiohttp.ServerTimeoutError,
    h1.ReadTimeoutError,
)


class _Answer(Protocol):
    """What both clients' answers offer (aiohttp's ``ClientResponse``, ``h1.Response``)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read(self) -> bytes: ...

    def close(self) -> None: ...


class HTTPUpstream(Upstream):
    """An OpenAI-compatible server (``type: openai``) or the Anthropic API
    (``type: anthropic``) reached over HTTP.

    Retries go through ``reef.core.retrying``: ``backoff_seconds`` is the first retry's
    longest delay; later retries double it (capped at 8 s), each a full-jitter draw
    below it. ``Retry-After`` on a 429 or 503 overrides it. ``sleep`` is the wait
    between attempts (a test records the waits instead).
    """

    def __init__(
        self,
        name: str,
        config: UpstreamConfig,
        *,
        backoff_seconds: float = 0.25,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if config.type == "local" or not config.base_url:
            raise ReefError(
                f"upstream {name!r}: HTTPUpstream needs an openai or anthropic "
                "upstream with a base_url"
            )
        self.name = name
        self.dialect: Dialect = "anthropic" if config.type == "anthropic" else "openai"
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        # The server's root, for routes vLLM serves outside /v1 (/tokenize).
        self.root_url = self.base_url.removesuffix("/v1")
        self._backoff_seconds = backoff_seconds
        self._sleep = sleep
        self._defaults: dict[str, str] = {"content-type": "application/json"}
        self._credentials: dict[str, str] = {}
        key = config.api_key.get_secret_value() if config.api_key else None
        if self.dialect == "anthropic":
            self._defaults["anthropic-version"] = config.anthropic_version
            if key:
                self._credentials["x-api-key"] = key
        elif key:
            self._credentials["authorization"] = f"Bearer {key}"
        self._headers = {**self._defaults, **self._credentials}
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._target = h1.Target.of(self.base_url)  # None: every call through aiohttp
        self._pool: h1.Pool | None = None

    # -- the Upstream contract -------------------------------------------------------

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Make a non-streaming call; see ``Upstream.send`` for retries and errors."""
        response = await self._open(
            "POST", request.path, request.body, self._merge(request), lean=True
        )
        body = await self._read_body(response)
        return UpstreamResponse(
            response.status, body, response.headers.get("Content-Type", "application/json")
        )

    async def open_stream(self, request: UpstreamRequest) -> UpstreamStream:
        """Start a streaming call; retried only until the response headers arrive."""
        response = await self._open("POST", request.path, request.body, self._merge(request))
        content_type = response.headers.get("Content-Type")
        # Missing is let through (the events will tell); anything else is not a stream,
        # and saying so now lets the client get an HTTP error instead of a broken stream.
        if content_type is not None and not content_type.lower().startswith(_EVENT_STREAM):
            response.close()
            raise UpstreamMalformedError(
                f"upstream {self.name!r} answered a stream request with Content-Type "
                f"{content_type!r}, not {_EVENT_STREAM}"
            )
        return HTTPUpstreamStream(self, response)

    async def count_chat_tokens(self, body: bytes) -> int:
        """``POST {root}/tokenize`` (vLLM, the embedded engine; root: ``base_url``
        without ``/v1``) and its ``count``; a 404 or 405 there, or an Anthropic
        upstream, is ``UpstreamUnsupportedError``."""
        if self.dialect == "anthropic":
            raise UpstreamUnsupportedError(f"upstream {self.name!r} tokenizes no chat")
        try:
            response = await self._open(
                "POST", "/tokenize", body, self._headers, base=self.root_url
            )
        except UpstreamRejectedError as exc:
            if exc.upstream_status in (404, 405):
                raise UpstreamUnsupportedError(
                    f"upstream {self.name!r} has no POST /tokenize", exc.upstream_status
                ) from exc
            raise
        answer = await self._read_body(response)
        try:
            count = loads(answer)["count"]
        except (ValueError, KeyError, TypeError):
            count = None
        if not isinstance(count, int) or isinstance(count, bool):
            raise UpstreamMalformedError(
                f"upstream {self.name!r}: /tokenize answered no count: {answer[:200]!r}"
            )
        return count

    async def list_models(self) -> list[str]:
        """Ids in ``GET {base_url}/models`` (``data[].id`` in both dialects)."""
        return [str(card["id"]) for card in await self.model_cards()]

    async def model_cards(self) -> list[dict[str, Any]]:
        """The cards in ``GET {base_url}/models`` (``data``; each with an ``id``)."""
        response = await self._open("GET", "/models", None, self._headers)
        body = await self._read_body(response)
        try:
            cards = loads(body)["data"]
            if not all(isinstance(card, dict) and "id" in card for card in cards):
                raise TypeError("a card without an id")
            return [dict(card) for card in cards]
        except (ValueError, KeyError, TypeError) as exc:
            raise UpstreamUnavailableError(
                f"upstream {self.name!r}: /models answered something that is not a model "
                f"list: {body[:200]!r}"
            ) from exc

    async def load_adapter(
        self, name: str, path: str, expected_digest: str | None, on: str | None = None
    ) -> None:
        """``POST {base_url}/load_lora_adapter`` (vLLM's runtime LoRA API; vLLM ignores
        ``expected_digest``, the embedded engine verifies it; ``on``, a loaded checkpoint
        to run the adapter on, is sent as ``base_model_name``, which only the embedded
        engine takes)."""
        payload = {"lora_name": name, "lora_path": path}
        if on is not None:
            payload["base_model_name"] = on
        await self._load_call("/load_lora_adapter", payload, expected_digest)

    async def unload_adapter(self, name: str) -> None:
        """``POST {base_url}/unload_lora_adapter``."""
        await self._adapter_call("/unload_lora_adapter", {"lora_name": name})

    async def load_checkpoint(self, name: str, path: str, expected_digest: str | None) -> None:
        """``POST {base_url}/load_checkpoint`` (the embedded engine's; it verifies
        ``expected_digest`` and answers 507 when the weights would not fit). A server
        without the route (vLLM, SGLang) is told apart: they reload in place."""
        try:
            await self._load_call("/load_checkpoint", {"name": name, "path": path}, expected_digest)
        except UpstreamRejectedError as exc:
            if exc.upstream_status not in (404, 405):
                raise
            raise UpstreamRejectedError(
                f"upstream {self.name!r} has no POST /v1/load_checkpoint (the embedded "
                "engine's, to load a checkpoint beside the serving weights): for vLLM or "
                f"SGLang set upstreams.{self.name}.checkpoint_loading to vllm or sglang, "
                "which reloads their one set of weights in place (docs/releases.md)",
                status=502,
                upstream_status=exc.upstream_status,
            ) from exc

    async def unload_checkpoint(self, name: str) -> None:
        """``POST {base_url}/unload_checkpoint``."""
        await self._adapter_call("/unload_checkpoint", {"name": name})

    async def reload_weights(self, path: str) -> None:
        """In place, by ``checkpoint_loading``: vLLM ``POST {root}/collective_rpc``
        (``reload_weights`` from ``path``) then ``POST {root}/reset_prefix_cache`` (KV
        blocks computed by the old weights must not answer for the new ones); SGLang
        ``POST {root}/update_weights_from_disk`` (which flushes its cache itself). A 404
        means the server has no such route (vLLM without VLLM_SERVER_DEV_MODE=1)."""
        how = self.config.checkpoint_loading
        if how == "engine":
            await super().reload_weights(path)
        elif how == "vllm":
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": path}}
            await self._reload_call("/collective_rpc", rpc, "VLLM_SERVER_DEV_MODE=1")
            answer = await self._reload_call("/reset_prefix_cache", None, "VLLM_SERVER_DEV_MODE=1")
            if answer.get("success") is False:  # blocks still held: requests Reef did not send
                raise UpstreamUnavailableError(
                    f"upstream {self.name!r} reloaded {path} but could not reset its prefix "
                    "cache: requests that did not come through the gateway are running"
                )
        else:
            answer = await self._reload_call(
                "/update_weights_from_disk", {"model_path": path}, "an SGLang server"
            )
            if answer.get("success") is False:
                raise UpstreamRejectedError(
                    f"upstream {self.name!r} refused to load {path}: "
                    f"{str(answer.get('message'))[:_ERROR_TEXT_LIMIT]}",
                    status=502,
                )

    async def base_weights(self) -> str:
        """``base_weights`` when configured, else the ``root`` of the served model in
        ``GET {base_url}/models`` (vLLM and SGLang give the path they loaded)."""
        if self.config.checkpoint_loading == "engine":
            return await super().base_weights()
        if self.config.base_weights:
            return self.config.base_weights
        response = await self._open("GET", "/models", None, self._headers)
        body = await self._read_body(response)
        try:
            models = loads(body)["data"]
            wanted = [m for m in models if m.get("id") == self.config.model] or models
            roots = [m["root"] for m in wanted if isinstance(m.get("root"), str)]
        except (ValueError, KeyError, TypeError, AttributeError):
            roots = []
        if not roots:
            raise UpstreamMalformedError(
                f"upstream {self.name!r}: GET /models names no root for its model; set "
                "base_weights to the directory it serves the base model from"
            )
        return str(roots[0])

    async def _reload_call(
        self, path: str, payload: dict[str, Any] | None, needs: str
    ) -> dict[str, Any]:
        headers = {**self._headers, "Content-Type": "application/json"}
        body = None if payload is None else dumps(payload)
        try:
            response = await self._open("POST", path, body, headers, base=self.root_url)
        except UpstreamRejectedError as exc:
            if exc.upstream_status in (404, 405):
                raise UpstreamRejectedError(
                    f"upstream {self.name!r} has no POST {path} (checkpoint_loading: "
                    f"{self.config.checkpoint_loading} needs {needs})",
                    status=502,
                    upstream_status=exc.upstream_status,
                ) from exc
            raise
        answer = await self._read_body(response)
        try:
            parsed = loads(answer) if answer.strip() else {}
        except ValueError:
            parsed = {}
        return parsed if isinstance(parsed, dict) else {}

    async def _load_call(
        self, path: str, payload: dict[str, str], expected_digest: str | None
    ) -> None:
        """A load route's call: ``expected_digest`` added when known; a name already
        loaded is ``AdapterAlreadyLoadedError`` (adapters and checkpoints alike)."""
        if expected_digest is not None:
            payload["expected_digest"] = expected_digest
        try:
            await self._adapter_call(path, payload)
        except UpstreamRejectedError as exc:
            if _already_loaded(exc):
                raise AdapterAlreadyLoadedError(
                    exc.message, exc.status, exc.upstream_status, exc.code
                ) from exc
            raise

    async def _adapter_call(self, path: str, payload: dict[str, str]) -> None:
        headers = {**self._headers, "Content-Type": "application/json"}
        response = await self._open("POST", path, dumps(payload), headers)
        await self._read_body(response)

    async def aclose(self) -> None:
        """Close pooled connections; the next call opens a new pool."""
        session, self._session, self._loop = self._session, None, None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        if session is not None and not session.closed:
            await session.close()

    # -- internals -------------------------------------------------------------------

    async def _read_body(self, response: _Answer) -> bytes:
        try:
            return await self._read_whole(response)
        except BaseException as exc:
            response.close()
            mapped = self._body_error(exc)
            if mapped is None:
                raise
            raise mapped from exc

    def _merge(self, request: UpstreamRequest) -> dict[str, str]:
        """The request's headers, less hop-by-hop ones, over the dialect's defaults;
        the configured credentials always win over a client's."""
        if not request.headers:
            return self._headers
        headers = dict(self._defaults)
        for key, value in request.headers.items():
            lowered = key.lower()
            if lowered not in _NOT_FORWARDED:
                headers[lowered] = value
        headers.update(self._credentials)
        return headers

    async def _read_whole(self, response: _Answer) -> bytes:
        """The whole body, within ``max_response_bytes`` (``h1.BodyTooLargeError`` past
        it: h1's pool counts itself, aiohttp's answers are counted here)."""
        if not isinstance(response, aiohttp.ClientResponse):
            return await response.read()
        limit = self.config.max_response_bytes
        announced = response.content_length
        if announced is not None and announced > limit:
            raise h1.BodyTooLargeError(limit, announced)
        chunks: list[bytes] = []
        size = 0
        while chunk := await response.content.readany():
            size += len(chunk)
            if size > limit:
                raise h1.BodyTooLargeError(limit)
            chunks.append(chunk)
        response.release()
        return b"".join(chunks)

    def _pool_now(self, loop: asyncio.AbstractEventLoop) -> h1.Pool | None:
        """The lean client's pool for this loop; ``None`` for an upstream it does not
        serve (``https``)."""
        if self._target is None:
            return None
        pool = self._pool
        if pool is None or pool.loop is not loop:
            pool = self._pool = h1.Pool(
                self._target,
                loop,
                max_connections=self.config.max_connections,
                max_body_bytes=self.config.max_response_bytes,
            )
        return pool

    def _session_now(self) -> aiohttp.ClientSession:
        session = self._session
        loop = asyncio.get_running_loop()
        if session is None or session.closed or self._loop is not loop:
            # A session belongs to the loop that made it; a new loop (tests, a
            # restarted server) needs its own.
            connector = aiohttp.TCPConnector(
                limit=self.config.max_connections, keepalive_timeout=_KEEPALIVE_SECONDS
            )
            session = aiohttp.ClientSession(
                connector=connector, trust_env=False, trace_configs=[_POOL_WAITS]
            )
            self._session, self._loop = session, loop
        return session

    @overload
    async def _open(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        base: str | None = None,
        *,
        lean: Literal[False] = False,
    ) -> aiohttp.ClientResponse: ...

    @overload
    async def _open(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        base: str | None = None,
        *,
        lean: Literal[True],
    ) -> _Answer: ...

    async def _open(  # noqa: C901
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        base: str | None = None,
        *,
        lean: bool = False,
    ) -> _Answer:
        """Send to ``base`` (default ``base_url``) + ``path`` until a 2xx arrives
        (returned unread) or no retry is allowed; ``lean``: through ``h1`` when it
        serves this upstream (a complete answer's call).

        The total deadline is each attempt's ``total``, so that it also bounds reading
        the body of the attempt that succeeds.
        """
        loop = asyncio.get_running_loop()
        pool = self._pool_now(loop) if lean and base is None else None
        session = self._session_now() if pool is None else None
        waits = _PoolWait()  # aiohttp's: whether the call waits for a free connection
        config = self.config
        url = (base or self.base_url) + path
        retrier = Retrier(
            RetryPolicy(
                retries=config.max_retries,
                base_seconds=self._backoff_seconds,
                cap_seconds=_BACKOFF_CAP_SECONDS,
                deadline_seconds=config.total_timeout_seconds,
            )
        )
        while True:
            remaining = retrier.remaining()
            if remaining is None or remaining <= 0:
                raise self._deadline_error()
            # A wait for a free connection is bounded by the deadline alone (``connect``
            # would bound it too), the connection's opening by the connect timeout.
            timeout = aiohttp.ClientTimeout(
                total=remaining,
                sock_connect=config.connect_timeout_seconds,
                sock_read=config.read_timeout_seconds,
            )
            retry_after: float | None = None
            sent_at = loop.time()
            response: _Answer
            try:
                if pool is not None:
                    limits = h1.Limits(
                        config.connect_timeout_seconds, config.read_timeout_seconds, remaining
                    )
                    response = await pool.request(method, path, body, headers, limits)
                else:
                    assert session is not None  # one of the two is made above
                    response = await session.request(
                        method,
                        url,
                        data=body,
                        headers=headers,
                        timeout=timeout,
                        allow_redirects=False,
                        trace_request_ctx=waits,
                    )
            except h1.InvalidHeaderError as exc:
                raise InvalidInputError(f"a header cannot be sent upstream: {exc}") from exc
            except h1.PoolTimeoutError as exc:
                raise self._busy_error() from exc
            except h1.BodyTooLargeError as exc:  # announced by its Content-Length
                raise self._oversized_body(exc.announced) from exc
            except (aiohttp.ConnectionTimeoutError, h1.ConnectTimeoutError) as exc:
                # Nothing reached the upstream, so another attempt is safe.
                failure: UpstreamError = UpstreamTimeoutError(
                    f"upstream {self.name!r}: no connection within "
                    f"{config.connect_timeout_seconds}s"
                )
                failure.__cause__ = exc
            except TimeoutError as exc:
                if waits.waiting:
                    raise self._busy_error() from exc
                if not _poisoned(exc, loop.time() - sent_at, config.read_timeout_seconds):
                    raise self._timeout_error(exc) from exc
                failure = UpstreamUnavailableError(
                    f"upstream {self.name!r}: a pooled connection failed at once ({exc})"
                )
                failure.__cause__ = exc
                retry_after = 0.0  # a fresh connection, now: nothing is wrong upstream
            except h1.StaleConnectionError as exc:
                # Closed by the upstream as it idled, before a byte of the answer.
                failure = UpstreamUnavailableError(
                    f"upstream {self.name!r}: a pooled connection was closed ({exc})"
                )
                failure.__cause__ = exc
                retry_after = 0.0
            except (aiohttp.ClientConnectionError, OSError) as exc:
                failure = UpstreamUnavailableError(f"upstream {self.name!r} unreachable: {exc}")
                failure.__cause__ = exc
            except (aiohttp.ClientError, h1.MalformedResponseError) as exc:
                raise UpstreamUnavailableError(
                    f"upstream {self.name!r} answered with a malformed response: {exc}"
                ) from exc
            else:
                status = response.status
                if status < 300:
                    return response
                message, code = await self._error_text(response)
                if status == 501:  # not implemented: no retry makes it so
                    raise UpstreamUnsupportedError(
                        f"upstream {self.name!r} does not implement {method} {path}: {message}",
                        status,
                    )
                if (status != 429 and status < 500) or status == 507:
                    # 507: a checkpoint that does not fit; it will not fit on a retry
                    raise _not_retried(message, status, code)
                failure = UpstreamUnavailableError(message, upstream_status=status)
                if status in (429, 503):
                    retry_after = parse_retry_after(response.headers.get("Retry-After"))
            # No retry once the retries are spent, or when waiting would only end in
            # a timeout.
            if not await retrier.pause(retry_after, self._sleep):
                raise failure

    async def _error_text(self, response: _Answer) -> tuple[str, str | None]:
        """The error body's message and its ``error.code``, if any."""
        try:
            body = await self._read_whole(response)
        except (
            TimeoutError,
            aiohttp.ClientError,
            OSError,
            h1.MalformedResponseError,
            h1.BodyTooLargeError,
        ):
            response.close()
            body = b""
        return error_message_from_body(body, response.status), _error_code(body)

    def _timeout_error(self, exc: BaseException, *, began: bool = False) -> UpstreamTimeoutError:
        """A read timeout (``began``: the answer had started, so it stalled) or the
        total deadline."""
        read_timeouts = (
            aiohttp.SocketTimeoutError | aiohttp.ServerTimeoutError | h1.ReadTimeoutError
        )
        if isinstance(exc, read_timeouts):
            seconds = self.config.read_timeout_seconds
            if began:
                return UpstreamStalledError(
                    f"upstream {self.name!r} began its answer, then sent nothing for {seconds}s"
                )
            return UpstreamTimeoutError(f"upstream {self.name!r} sent nothing for {seconds}s")
        return self._deadline_error()

    def _busy_error(self) -> UpstreamBusyError:
        limit = self.config.max_connections
        return _logged(
            UpstreamBusyError(
                f"upstream {self.name!r}: all {limit} connections the gateway may open to it "
                f"(upstreams.{self.name}.max_connections) stayed busy for the call's whole "
                f"deadline ({self.config.total_timeout_seconds}s); retry later, or raise "
                "that setting if the upstream serves more requests at once"
            )
        )

    def _oversized_body(self, announced: int | None = None) -> UpstreamOversizedError:
        limit = self.config.max_response_bytes
        size = f" (its Content-Length: {announced})" if announced is not None else ""
        return _logged(
            UpstreamOversizedError(
                f"upstream {self.name!r} answered more than {limit} bytes{size}; raise "
                f"upstreams.{self.name}.max_response_bytes if answers this large are expected"
            )
        )

    def _long_line(self) -> UpstreamOversizedError:
        limit = self.config.max_sse_line_bytes
        return _logged(
            UpstreamOversizedError(
                f"upstream {self.name!r} sent an event-stream line longer than {limit} bytes "
                f"without ending it; raise upstreams.{self.name}.max_sse_line_bytes if its "
                "events are legitimately that long"
            )
        )

    def _deadline_error(self) -> UpstreamTimeoutError:
        return UpstreamTimeoutError(
            f"upstream {self.name!r} did not finish within {self.config.total_timeout_seconds}s"
        )

    def _body_error(self, exc: BaseException) -> UpstreamError | None:
        """Map a failure while reading a body (after the headers, so never retried);
        ``None`` for anything that is not the upstream's fault (cancellation)."""
        if isinstance(exc, h1.BodyTooLargeError):
            return self._oversized_body(exc.announced)
        if isinstance(exc, TimeoutError):
            return self._timeout_error(exc, began=True)
        if isinstance(exc, aiohttp.ClientError | ConnectionError | h1.MalformedResponseError):
            return UpstreamTruncatedError(
                f"upstream {self.name!r} dropped the connection mid-response: {exc}"
            )
        return None


class HTTPUpstreamStream(UpstreamStream):
    """The body of a streaming response, chunk by chunk as the upstream sends it, within
    its upstream's ``max_response_bytes`` in all and ``max_sse_line_bytes`` a line."""

    def __init__(self, upstream: HTTPUpstream, response: aiohttp.ClientResponse) -> None:
        self.status = response.status
        self.content_type = response.headers.get("Content-Type", "text/event-stream")
        self.headers: Mapping[str, str] = response.headers
        self.max_line_bytes = upstream.config.max_sse_line_bytes
        self._max_bytes = upstream.config.max_response_bytes
        self._upstream = upstream
        self._response = response
        self._closed = False
        self._failure: UpstreamOversizedError | None = None  # raised at the next read
        self.received = 0  # bytes so far
        self.line = 0  # bytes since the last line break

    def __aiter__(self) -> HTTPUpstreamStream:
        return self

    async def __anext__(self) -> bytes:
        if self._failure is not None:
            await self.aclose()
            raise self._failure
        if self._closed:
            raise StopAsyncIteration
        try:
            chunk = await self._response.content.readany()
        except BaseException as exc:
            await self.aclose()
            mapped = self._upstream._body_error(exc)
            if mapped is None:
                raise
            raise mapped from exc
        if not chunk:
            await self.aclose()
            raise StopAsyncIteration
        return await self._measured(chunk)

    async def _measured(self, chunk: bytes) -> bytes:
        """``chunk``, counted against the bounds. Past the line bound, its lines that
        ended are still passed on (the events before the endless one), and the error
        comes at the next read."""
        self.received += len(chunk)
        if self.received > self._max_bytes:
            await self.aclose()
            raise self._upstream._oversized_body()
        if chunk[-1:] in (b"\n", b"\r"):
            self.line = 0
            return chunk
        cut = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
        self.line = self.line + len(chunk) if cut < 0 else len(chunk) - cut - 1
        if self.line <= self.max_line_bytes:
            return chunk
        self._failure = self._upstream._long_line()
        if cut < 0:
            await self.aclose()
            raise self._failure
        return chunk[: cut + 1]

    async def aclose(self) -> None:
        """Return a finished connection to the pool; close an unfinished one, so the
        upstream sees the client leave and stops generating. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class _PoolWait:
    """One aiohttp call's trace context: whether it waits for a free connection (the
    connector is at ``max_connections``) now."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting = False


async def _queued(
    session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceConnectionQueuedStartParams
) -> None:
    if isinstance(context.trace_request_ctx, _PoolWait):
        context.trace_request_ctx.waiting = True


async def _unqueued(
    session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceConnectionQueuedEndParams
) -> None:
    if isinstance(context.trace_request_ctx, _PoolWait):
        context.trace_request_ctx.waiting = False


# A wait for a free connection that the deadline ends is told apart from a slow upstream
# by these (aiohttp raises the same ``TimeoutError`` for both).
_POOL_WAITS: Final = aiohttp.TraceConfig()
_POOL_WAITS.on_connection_queued_start.append(_queued)
_POOL_WAITS.on_connection_queued_end.append(_unqueued)
_POOL_WAITS.freeze()


def _logged(error: _Capped) -> _Capped:
    """``error`` once logged: a bound was reached, which the operator may need to raise."""
    log.warning("%s", error.message)
    return error


def build_upstream(name: str, config: UpstreamConfig) -> Upstream:
    """The ``Upstream`` for one ``upstreams:`` entry of the configuration.

    Raises ``ReefError`` for ``type: local`` until the embedded engine exists.
    """
    if config.type == "local":
        raise ReefError(
            f"upstream {name!r} has type 'local': the embedded engine is not available in "
            "this build; configure an openai or anthropic upstream with a base_url"
        )
    return HTTPUpstream(name, config)


def error_message_from_body(body: bytes, status: int) -> str:
    """The upstream's own error message from an error body.

    Understands OpenAI ``{"error": {"message"}}``, Anthropic ``{"type": "error",
    "error": {"message"}}``, ``{"error": "..."}``, ``{"message"}`` and ``{"detail"}``
    (vLLM, FastAPI); otherwise the start of the body as text.
    """
    try:
        data: Any = loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return text[:_ERROR_TEXT_LIMIT] or f"upstream answered HTTP {status}"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        for key in ("message", "detail"):
            if isinstance(data.get(key), str) and data[key]:
                return str(data[key])
    return body.decode("utf-8", "replace")[:_ERROR_TEXT_LIMIT]


def _poisoned(exc: BaseException, elapsed: float, read_timeout: float) -> bool:
    """Whether a read timeout before the headers is a pooled connection's stale one.

    A real ``sock_read`` timeout cannot fire before ``read_timeout`` has passed on the
    loop's clock (``elapsed`` is measured on it: uvloop's lags ``time.monotonic`` by up
    to a loop iteration). aiohttp 3.14 can leave the timer armed on a connection already
    back in the pool (reading resumed after back-pressure while the finished body is
    drained; aio-libs/aiohttp#12953 fixed only the unpaused case); it fires while the
    connection idles and the next request on it fails at once, although the request
    may have reached the upstream. Seen after a 100 MB streamed answer: the next
    request got a 504 in 30 ms.
    """
    return isinstance(exc, aiohttp.SocketTimeoutError) and elapsed < read_timeout * 0.9


def _not_retried(message: str, status: int, code: str | None) -> UpstreamError:
    if status < 400:  # a redirect: not the client's fault, and not followed
        return UpstreamUnavailableError(
            f"upstream answered an unexpected HTTP {status}: {message}", upstream_status=status
        )
    return UpstreamRejectedError(message, status=status, upstream_status=status, code=code)


def _error_code(body: bytes) -> str | None:
    """``error.code`` of an OpenAI-style error body, when it is a string."""
    try:
        data: Any = loads(body)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _already_loaded(exc: UpstreamRejectedError) -> bool:
    """Whether a refused ``load_lora_adapter`` says the name is served already: the
    embedded engine says so by its error code; vLLM has no code for it, only a 400 whose
    message is part of its runtime-LoRA protocol ("The lora adapter 'x' has already been
    loaded."), read here and nowhere else."""
    if exc.code == ADAPTER_ALREADY_LOADED:
        return True
    return exc.upstream_status == 400 and _VLLM_ALREADY_LOADED.search(exc.message) is not None

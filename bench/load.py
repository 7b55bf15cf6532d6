"""Closed-loop HTTP load for the overhead benchmark: N requests at concurrency C.

One ``aiohttp.ClientSession`` with keep-alive sends every request; each of C workers
sends its next request as soon as the previous one is answered. The body and headers
are what the OpenAI Python SDK sends for a one-line chat (non-streaming):
``CHAT_BODY`` for ``/chat/completions``, ``RESPONSES_BODY`` (the same system text and
user line, as ``instructions`` and ``input``) for ``/responses``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from dataclasses import dataclass, field

import aiohttp

MODEL = "fake-model"
CHAT_BODY = (
    b'{"messages":[{"role":"system","content":"You are a helpful assistant."},'
    b'{"role":"user","content":"Say hello to request %d"}],"model":"' + MODEL.encode() + b'"}'
)
RESPONSES_BODY = (
    b'{"input":"Say hello to request %d","instructions":"You are a helpful assistant.",'
    b'"model":"' + MODEL.encode() + b'"}'
)
_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30)
MAX_ERRORS = 20  # past this a target is broken, not slow: stop its round


def sdk_headers(api_key: str) -> dict[str, str]:
    """Headers as ``openai.AsyncOpenAI`` sends them (without the retry bookkeeping)."""
    return {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "Authorization": f"Bearer {api_key}",
        "User-Agent": "AsyncOpenAI/Python 1.109.1",
        "X-Stainless-Lang": "python",
        "X-Stainless-Package-Version": "1.109.1",
        "X-Stainless-OS": "Linux",
        "X-Stainless-Arch": "x64",
        "X-Stainless-Runtime": "CPython",
        "X-Stainless-Runtime-Version": "3.11.7",
        "X-Stainless-Async": "async:asyncio",
        "X-Stainless-Retry-Count": "0",
    }


@dataclass
class LoadResult:
    """Latencies (ms, in completion order) and wall time of one measured round."""

    target: str
    concurrency: int
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    receipts: list[str] = field(default_factory=list)  # x-reef-record-id values
    cpu_seconds: float | None = None  # the serving process's CPU (user + system) in the round
    receipts_seen: int | None = None  # wrk keeps a sample in ``receipts``; this many came back
    requests_sent: int | None = None  # wrk's rounds are timed, not counted: what it sent
    loader_cpu_seconds: float | None = None  # wrk's own CPU in the round
    store_cpu_seconds: float | None = None  # Reef on a local PostgreSQL: the server's CPU

    @property
    def receipt_count(self) -> int:
        """Receipts returned in the round (all of them, not only those kept)."""
        return len(self.receipts) if self.receipts_seen is None else self.receipts_seen

    @property
    def cpu_us_per_request(self) -> float | None:
        """The serving process's CPU per answered request, in microseconds."""
        if self.cpu_seconds is None or not self.latencies_ms:
            return None
        return self.cpu_seconds * 1e6 / len(self.latencies_ms)

    @property
    def store_cpu_us_per_request(self) -> float | None:
        """The store server's CPU per answered request, in microseconds (when known)."""
        if self.store_cpu_seconds is None or not self.latencies_ms:
            return None
        return self.store_cpu_seconds * 1e6 / len(self.latencies_ms)

    @property
    def throughput(self) -> float:
        """Answered requests per second over the round's wall time."""
        return len(self.latencies_ms) / self.seconds if self.seconds else 0.0

    def percentile(self, fraction: float) -> float:
        """Nearest-rank percentile of the latencies, e.g. ``0.99``."""
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return math.nan
        rank = min(len(ordered), max(1, math.ceil(fraction * len(ordered))))
        return ordered[rank - 1]


class TooManyErrorsError(RuntimeError):
    """A round saw more than ``MAX_ERRORS`` failed requests."""


async def _worker(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    tickets: itertools.count[int],
    total: int,
    result: LoadResult,
) -> None:
    for index in tickets:  # shared by all workers: each index is taken once
        if index >= total:
            return
        started = time.perf_counter()
        status, receipt, error = 0, None, ""
        try:
            async with session.post(
                url, data=body % index, headers=headers, timeout=_REQUEST_TIMEOUT
            ) as response:
                await response.read()
                status = response.status
                receipt = response.headers.get("x-reef-record-id")
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        elapsed = (time.perf_counter() - started) * 1000.0
        if status == 200:
            result.latencies_ms.append(elapsed)
            if receipt is not None:
                result.receipts.append(receipt)
            continue
        result.errors.append(f"HTTP {status}" if status else error)
        if len(result.errors) > MAX_ERRORS:
            raise TooManyErrorsError(f"{result.target}: {result.errors[-1]}")


async def drive(
    session: aiohttp.ClientSession,
    target: str,
    url: str,
    headers: dict[str, str],
    concurrency: int,
    requests: int,
    time_limit_seconds: float,
    body: bytes = CHAT_BODY,
) -> LoadResult:
    """Send ``requests`` requests (``body``, ``%d`` filled with the request's index) to
    ``url`` with ``concurrency`` in flight.

    Raises ``TimeoutError`` past ``time_limit_seconds`` and ``TooManyErrorsError``
    when the target keeps failing.
    """
    result = LoadResult(target, concurrency)
    tickets = itertools.count()
    workers = min(concurrency, requests)
    started = time.perf_counter()
    async with asyncio.timeout(time_limit_seconds), asyncio.TaskGroup() as group:
        for _ in range(workers):
            group.create_task(_worker(session, url, body, headers, tickets, requests, result))
    result.seconds = time.perf_counter() - started
    return result


def client_session(max_concurrency: int) -> aiohttp.ClientSession:
    """The one client session. Idle connections are dropped after 2 s, before uvicorn's
    5 s keep-alive timeout closes them under a request."""
    connector = aiohttp.TCPConnector(
        limit=max_concurrency, limit_per_host=max_concurrency, keepalive_timeout=2.0
    )
    return aiohttp.ClientSession(connector=connector, trust_env=False)

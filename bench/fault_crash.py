"""SIGKILL of a gateway under concurrent streams (``bench/faults.py``): every receipt a
client saw is in the store afterwards.

Each client streams again and again, alternating OpenAI (``/v1/chat/completions``) and
Anthropic (``/v1/messages``) requests, and reads each stream to its end. Once
``kill_after`` streams have ended properly the gateway gets SIGKILL with every client
mid-way through a stream. With ``sync`` durability a stream's final event
(``data: [DONE]``, ``event: message_stop``) leaves only after its record is committed,
so each of those receipts must be stored. A stream cut by the kill has no proper end,
so its client knows the answer was not completed; its record was stored ``pending``
before the stream's headers, so its receipt must be stored too. Then the store is
settled as the next gateway start settles it (``ExperienceStore.settle_pending``):
every cut stream's record must have left ``pending``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from fault_cells import Gateway
from tests.fakes.upstream import FakeUpstreamThread

from reef.experience import open_store

_ENDS = {"openai": b"data: [DONE]", "anthropic": b"event: message_stop"}
_DEADLINE_SECONDS = 120.0


@dataclass
class CrashResult:
    """What the clients saw and what the store kept."""

    clients: int
    kill_after: int
    ended: list[str] = field(default_factory=list)  # receipts of properly ended streams
    cut: list[str] = field(default_factory=list)  # receipts of streams the kill cut
    failed: int = 0  # requests refused or broken before their headers
    failures: dict[str, int] = field(default_factory=dict)  # why, e.g. "503" or an error name
    killed_by_sigkill: bool = False
    integrity: str = "not checked"
    stored: dict[str, str] = field(default_factory=dict)  # record id -> status, at the kill
    settled: dict[str, str] = field(default_factory=dict)  # ... after the next start's settling
    seconds: float = 0.0

    @property
    def lost(self) -> list[str]:
        """Receipts a client saw (streams ended or cut) that are not in the store."""
        return [receipt for receipt in self.ended + self.cut if receipt not in self.stored]

    def fail(self, why: str) -> None:
        self.failed += 1
        self.failures[why] = self.failures.get(why, 0) + 1

    def failure_text(self) -> str:
        if not self.failed:
            return "none"
        return ", ".join(f"{count} {why}" for why, count in sorted(self.failures.items()))

    def statuses(self, receipts: list[str], where: dict[str, str]) -> str:
        counts: dict[str, int] = {}
        for receipt in receipts:
            status = where.get(receipt, "missing")
            counts[status] = counts.get(status, 0) + 1
        return ", ".join(f"{count} `{status}`" for status, count in sorted(counts.items()))

    @property
    def ok(self) -> bool:
        return (
            self.killed_by_sigkill
            and self.integrity == "ok"
            and len(self.ended) >= self.kill_after
            and not self.lost
            and all(self.settled.get(receipt) != "pending" for receipt in self.cut)
        )

    def text(self) -> str:
        return (
            f"crash: {self.clients} concurrent streams, SIGKILL after {len(self.ended)} "
            f"ended properly; {len(self.lost)} of {len(self.ended) + len(self.cut)} receipts "
            f"missing from the store; {len(self.cut)} streams cut by the kill (at the kill: "
            f"{self.statuses(self.cut, self.stored)}; after settling: "
            f"{self.statuses(self.cut, self.settled)}); {self.failed} requests failed before "
            f"their headers ({self.failure_text()}); integrity {self.integrity}: "
            f"{'ok' if self.ok else 'FAILED'}"
        )

    def markdown(self) -> list[str]:
        verdict = "**ok**" if self.ok else "**FAILED**"
        ended_stored = sum(receipt in self.stored for receipt in self.ended)
        cut_stored = sum(receipt in self.stored for receipt in self.cut)
        return [
            "### SIGKILL under concurrent streams",
            "",
            f"- {self.clients} clients, each streaming again and again (half OpenAI, half "
            f"Anthropic; 25 events 20 ms apart) through `reef serve` (`sync` durability); "
            f"SIGKILL once {self.kill_after} streams had ended properly, after "
            f"{self.seconds:.1f} s of load.",
            f"- Receipts of streams whose client saw the proper end: {len(self.ended)}; in "
            f"the store after the kill: {ended_stored} "
            f"({self.statuses(self.ended, self.stored)}).",
            f"- Streams cut mid-way by the kill: {len(self.cut)} (their clients had the "
            "receipt, then saw the connection drop without `[DONE]` or `message_stop`); "
            f"in the store: {cut_stored} ({self.statuses(self.cut, self.stored)}: a stream's "
            "record is stored `pending` before its headers leave); after the next start's "
            f"settling: {self.statuses(self.cut, self.settled)}.",
            f"- Receipts a client saw that name no stored record: {len(self.lost)}: {verdict}.",
            f"- Requests that failed before their headers (no receipt): {self.failed} "
            f"({self.failure_text()}).",
            f"- SQLite `PRAGMA integrity_check`: {self.integrity}.",
        ]


def crash_under_streams(
    start_gateway: Callable[[dict[str, str]], Gateway], clients: int, kill_after: int
) -> CrashResult:
    """Start a gateway with ``start_gateway``, load it with ``clients`` streams, SIGKILL
    it after ``kill_after`` proper ends, and check its store."""
    result = CrashResult(clients, kill_after)
    # Slow streams (25 events 20 ms apart): every client is mid-stream most of the time.
    with FakeUpstreamThread(slow_chunks=25, slow_interval=0.02) as fake:
        gateway = start_gateway({"fake": fake.base_url})
        try:
            started = time.monotonic()
            asyncio.run(_load_then_kill(gateway, result))
            result.seconds = time.monotonic() - started
        finally:
            if gateway.process.poll() is None:
                gateway.process.kill()
            gateway.process.wait(timeout=30)
    result.killed_by_sigkill = gateway.process.returncode == -signal.SIGKILL
    connection = sqlite3.connect(gateway.database)
    try:
        result.integrity = str(connection.execute("PRAGMA integrity_check").fetchone()[0])
        result.stored = dict(connection.execute("SELECT id, status FROM records").fetchall())
    finally:
        connection.close()
    store = open_store(f"sqlite:///{gateway.database}")
    try:
        store.settle_pending(datetime.now(UTC))  # what the next gateway start does
    finally:
        store.close()
    connection = sqlite3.connect(gateway.database)
    try:
        result.settled = dict(connection.execute("SELECT id, status FROM records").fetchall())
    finally:
        connection.close()
    return result


async def _load_then_kill(gateway: Gateway, result: CrashResult) -> None:
    killed = asyncio.Event()

    async def client(session: aiohttp.ClientSession, number: int) -> None:
        serial = 0
        while not killed.is_set():
            serial += 1
            dialect = "openai" if (number + serial) % 2 else "anthropic"
            url, body = _request(gateway.url, dialect, f"slow-stream crash-{number}-{serial}")
            receipt: str | None = None
            ended = False
            try:
                async with session.post(url, json=body) as response:
                    if response.status != 200:
                        result.fail(str(response.status))
                        continue
                    receipt = response.headers["x-reef-record-id"]
                    async for line in response.content:
                        ended = ended or line.startswith(_ENDS[dialect])
            except (aiohttp.ClientError, TimeoutError) as error:
                if receipt is None:
                    result.fail(type(error).__name__)
                    continue
            # Seen the end: the record was committed before it was sent, whatever came after.
            (result.ended if ended else result.cut).append(receipt)
            if len(result.ended) >= result.kill_after and not killed.is_set():
                os.kill(gateway.process.pid, signal.SIGKILL)
                killed.set()

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=_DEADLINE_SECONDS)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.wait_for(
            asyncio.gather(*(client(session, n) for n in range(result.clients))),
            _DEADLINE_SECONDS,
        )


def _request(base: str, dialect: str, text: str) -> tuple[str, dict[str, object]]:
    messages = [{"role": "user", "content": text}]
    if dialect == "openai":
        body = {"model": "reef/openai-fake", "messages": messages, "stream": True}
        return base + "/v1/chat/completions", body
    body = {
        "model": "reef/anthropic-fake",
        "max_tokens": 32,
        "messages": messages,
        "stream": True,
    }
    return base + "/v1/messages", body

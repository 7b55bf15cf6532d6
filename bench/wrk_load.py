"""Closed-loop HTTP load from ``wrk``, for the overhead benchmark's ``--loader wrk``.

Why a native loader: the Python loader (``load.py``, aiohttp in the benchmark's own
process) spends most of a core on a 2-core machine, so a second gateway worker has no
core left to use (3,998 req/s with one Reef process, 3,314 with two; passthrough 5,639
and 5,692). wrk costs ~10-20 µs of CPU per request against the gateway's ~255 µs.

One round is one ``wrk`` process: ``-c`` connections with keep-alive, each sending its
next request as soon as the previous one is answered, for a given number of seconds.
A Lua script (written to a temporary file) sends the same body and headers as the
Python loader, the body's ``%d`` filled from a per-thread counter, and:

- counts the requests it sends (not the one wrk builds only to check them), and in
  ``response()`` the answers, the 2xx answers and the ``x-reef-record-id`` receipts
  (every tenth receipt kept as a sample);
- stops sending at the round's deadline (an empty request leaves a connection idle)
  while ``-d`` runs a second longer, so the answers in flight arrive and the count of
  Reef's records can equal the requests sent (wrk alone would drop them unanswered);
- times the round from its first request to its last answer (LuaJIT's ffi,
  ``CLOCK_MONOTONIC``), since wrk's own duration includes that idle second;
- prints, in ``done()``, one line ``REEF_WRK {json}``: the counts, wrk's socket errors
  and its latency histogram (µs -> count), read from wrk's array in one pass (wrk's
  ``latency(i)`` rescans it per value: seconds for a round with a long tail).

wrk adds samples to that histogram before ``done()`` sees it (``stats_correct``: for
every latency over twice the mean interval per connection, copies at one-interval steps
below it, its coordinated-omission correction). ``uncorrected`` takes them out again, so
the percentiles are of the latencies measured, as with the Python loader. Unlike it, the
histogram also holds non-2xx answers' latencies (a round with errors is reported as one).
"""

from __future__ import annotations

import asyncio
import json
import math
import resource
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load import LoadResult

MARK = "REEF_WRK "
RECEIPT_SAMPLE_EVERY = 10
DRAIN_SECONDS = 1.0  # past the deadline, for the answers in flight
TIMEOUT_SECONDS = 10  # wrk's socket timeout; its histogram holds up to this many µs

_LUA = """\
local ffi = require("ffi")
ffi.cdef[[
typedef struct {{ long tv_sec; long tv_nsec; }} reef_timespec;
int clock_gettime(int clk_id, reef_timespec *tp);
]]
local clock = ffi.new("reef_timespec")
local function now_us()
  ffi.C.clock_gettime(1, clock)  -- CLOCK_MONOTONIC
  return tonumber(clock.tv_sec) * 1000000 + tonumber(clock.tv_nsec) / 1000
end

local SECONDS = {seconds}
local PATH = {path}
local HEADERS = {headers}
local BODY_HEAD, BODY_TAIL = {body_head}, {body_tail}
local SAMPLE_EVERY = {sample_every}

local threads = {{}}
function setup(thread)
  table.insert(threads, thread)
  thread:set("counter", (#threads - 1) * 1000000000)
  -- wrk builds the first thread's first request once to check it, and never sends it
  thread:set("unsent", #threads == 1 and 1 or 0)
end

sent, answered, ok, receipted, first_us, last_us = 0, 0, 0, 0, 0, 0
receipts = {{}}
local deadline = nil
local head = nil  -- request line and headers, wrk.format's, but for Content-Length

function request()
  if head == nil then
    local bare = wrk.format("POST", PATH, HEADERS, nil)  -- ends with the blank line
    head = string.sub(bare, 1, -3) .. "Content-Length: "
  end
  if unsent > 0 then
    unsent = 0
    return wrk.format("POST", PATH, HEADERS, BODY_HEAD .. "0" .. BODY_TAIL)
  end
  local now = now_us()
  if deadline == nil then
    deadline = now + SECONDS * 1000000
    first_us = now
  end
  if now >= deadline then
    return ""  -- nothing written: the connection waits, idle, until wrk stops
  end
  sent = sent + 1
  local body = BODY_HEAD .. string.format("%d", counter) .. BODY_TAIL
  counter = counter + 1
  return head .. #body .. "\\r\\n\\r\\n" .. body
end

function response(status, headers, body)
  answered = answered + 1
  last_us = now_us()
  if status >= 200 and status < 300 then
    ok = ok + 1
    local receipt = headers["x-reef-record-id"] or headers["X-Reef-Record-Id"]
    if receipt ~= nil then
      receipted = receipted + 1
      if receipted % SAMPLE_EVERY == 1 and string.match(receipt, "^[%w%-]+$") then
        table.insert(receipts, receipt)
      end
    end
  end
end

-- wrk's own way through the histogram, latency(i), scans it from the start for every
-- distinct value; its array read directly (struct stats: count, limit, min, max,
-- data[]) is one pass. The direct read is used only where its min and max agree with
-- wrk's.
local function histogram_of(latency)
  local out = {{}}
  local words = ffi.cast("uint64_t **", latency)[0]
  if tonumber(words[2]) == latency.min and tonumber(words[3]) == latency.max then
    for value = latency.min, latency.max do
      local count = tonumber(words[4 + value])
      if count > 0 then table.insert(out, string.format("[%d,%d]", value, count)) end
    end
  else
    for i = 1, #latency do
      local value, count = latency(i)
      table.insert(out, string.format("[%d,%d]", value, count))
    end
  end
  return out
end

function done(summary, latency, requests)
  local totals = {{sent = 0, answered = 0, ok = 0, receipted = 0}}
  local first, last = nil, 0
  local sample = {{}}
  for _, thread in ipairs(threads) do
    for name, _ in pairs(totals) do
      totals[name] = totals[name] + thread:get(name)
    end
    local began = thread:get("first_us")
    if began > 0 and (first == nil or began < first) then first = began end
    last = math.max(last, thread:get("last_us"))
    for _, receipt in ipairs(thread:get("receipts")) do
      table.insert(sample, '"' .. receipt .. '"')
    end
  end
  local histogram = histogram_of(latency)
  local e = summary.errors
  io.write(string.format(
    '{mark}{{"sent":%d,"answered":%d,"ok":%d,"receipted":%d,"first_us":%.0f,' ..
    '"last_us":%.0f,"wrk_duration_us":%d,"wrk_requests":%d,"connect":%d,"read":%d,' ..
    '"write":%d,"status":%d,"timeout":%d,"receipts":[%s],"latency_us":[%s]}}\\n',
    totals.sent, totals.answered, totals.ok, totals.receipted, first or 0, last,
    summary.duration, summary.requests, e.connect, e.read, e.write, e.status, e.timeout,
    table.concat(sample, ","), table.concat(histogram, ",")))
end
"""


def lua_string(text: str) -> str:
    """``text`` as a Lua string literal (every byte outside printable ASCII escaped)."""
    out = []
    for byte in text.encode():
        char = chr(byte)
        if char in '"\\' or not 32 <= byte < 127:
            out.append(f"\\{byte:03d}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def lua_script(path: str, headers: Mapping[str, str], body: bytes, seconds: float) -> str:
    """The Lua script of one round: POST ``body`` (its one ``%d`` filled with a counter)
    to ``path`` with ``headers`` for ``seconds``."""
    head, tail = body.decode().split("%d")
    table = ", ".join(f"[{lua_string(k)}] = {lua_string(v)}" for k, v in headers.items())
    return _LUA.format(
        seconds=repr(float(seconds)),
        path=lua_string(path),
        headers="{" + table + "}",
        body_head=lua_string(head),
        body_tail=lua_string(tail),
        sample_every=RECEIPT_SAMPLE_EVERY,
        mark=MARK,
    )


def uncorrected(histogram: Mapping[int, int], connections: int, duration_us: int,
                requests: int) -> dict[int, int]:  # fmt: skip
    """The latencies wrk measured, from the histogram its ``done()`` sees.

    wrk's ``stats_correct(expected)``, ``expected = duration_us / (requests /
    connections)`` in integer arithmetic, adds each value ``n >= 2 * expected``'s count
    to ``n - k * expected`` for every ``k >= 1`` while that is ``> expected``; it reads
    each count before anything is added to it (it walks upwards, adding downwards), so
    walking downwards and taking off what the larger values of the same residue added
    gives the measured counts back exactly.
    """
    if connections < 1 or requests // connections == 0:
        return {value: count for value, count in histogram.items() if count}
    expected = duration_us // (requests // connections)
    if expected <= 0:
        return {value: count for value, count in histogram.items() if count}
    above: dict[int, int] = {}  # residue modulo expected -> measured counts above
    measured: dict[int, int] = {}
    for value in sorted(histogram, reverse=True):
        residue = value % expected
        count = histogram[value] - (above.get(residue, 0) if value > expected else 0)
        if count < 0:
            raise ValueError(f"not a histogram wrk corrected with interval {expected} µs")
        if count:
            measured[value] = count
        if value >= 2 * expected:
            above[residue] = above.get(residue, 0) + count
    return measured


@dataclass(frozen=True)
class WrkRound:
    """What one wrk round's ``done()`` printed."""

    sent: int
    answered: int
    ok: int
    receipted: int
    seconds: float
    socket_errors: dict[str, int]
    receipts: list[str]
    latency_us: dict[int, int]  # measured (wrk's correction taken out)

    def to_result(self, target: str, concurrency: int) -> LoadResult:
        """The round as the Python loader's ``LoadResult``: latencies (all answers),
        errors (non-2xx, socket errors, requests unanswered at the end) and the receipt
        sample, ``receipts_seen`` the count of receipts returned."""
        result = LoadResult(target, concurrency, seconds=self.seconds)
        for value in sorted(self.latency_us):
            result.latencies_ms.extend([value / 1000.0] * self.latency_us[value])
        result.errors.extend(["HTTP non-2xx"] * (self.answered - self.ok))
        for kind, count in self.socket_errors.items():
            result.errors.extend([f"socket {kind}"] * count)
        result.errors.extend(["unanswered at the end"] * max(0, self.sent - self.answered))
        result.receipts = list(self.receipts)
        result.receipts_seen = self.receipted
        result.requests_sent = self.sent
        return result


def parse_output(stdout: str, connections: int) -> WrkRound:
    """The ``REEF_WRK`` line of a wrk run's output; ``ValueError`` when absent or when
    the histogram does not account for every answer wrk counted."""
    lines = [line for line in stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        raise ValueError("wrk printed no summary line (did the Lua script fail?)")
    raw: dict[str, Any] = json.loads(lines[-1][len(MARK) :])
    histogram = {int(value): int(count) for value, count in raw["latency_us"]}
    latency = uncorrected(histogram, connections, raw["wrk_duration_us"], raw["wrk_requests"])
    counted = sum(latency.values())
    if counted > raw["wrk_requests"] or (counted < raw["wrk_requests"] and not raw["timeout"]):
        raise ValueError(f"wrk counted {raw['wrk_requests']} answers, its histogram {counted}")
    span = (raw["last_us"] - raw["first_us"]) / 1e6
    return WrkRound(
        sent=int(raw["sent"]),
        answered=int(raw["answered"]),
        ok=int(raw["ok"]),
        receipted=int(raw["receipted"]),
        seconds=max(span, 0.0),
        socket_errors={k: int(raw[k]) for k in ("connect", "read", "write", "timeout") if raw[k]},
        receipts=[str(r) for r in raw["receipts"]],
        latency_us=latency,
    )


def warmup_seconds(warmup: int, requests: int, seconds: float | None) -> float:
    """A timed warm-up's length: ``warmup`` ms, or with a measured round of ``seconds``
    the share ``warmup / requests`` of it; at least 0.5 s, none for no warm-up."""
    if not warmup:
        return 0.0
    share = seconds * warmup / requests if seconds else warmup / 1000.0
    return max(0.5, share)


def wrk_path() -> str | None:
    """``wrk`` on PATH, or ``None``."""
    return shutil.which("wrk")


def threads_for(concurrency: int, threads: int) -> int:
    """wrk threads for a round: at most ``threads``, dividing ``concurrency`` (wrk gives
    each thread ``connections / threads`` connections)."""
    for count in range(min(threads, concurrency), 0, -1):
        if concurrency % count == 0:
            return count
    return 1


async def drive_wrk(
    url: str,
    headers: Mapping[str, str],
    concurrency: int,
    seconds: float,
    body: bytes,
    target: str,
    threads: int = 1,
) -> LoadResult:
    """One wrk round against ``url``: ``concurrency`` connections for ``seconds``.

    Raises ``FileNotFoundError`` without wrk, ``RuntimeError`` when wrk fails and
    ``ValueError`` when its output cannot be read.
    """
    wrk = wrk_path()
    if wrk is None:
        raise FileNotFoundError("wrk is not on PATH")
    prefix, _, path = url.partition("://")
    host, slash, rest = path.partition("/")
    count = threads_for(concurrency, threads)
    duration = math.ceil(seconds + DRAIN_SECONDS)
    with tempfile.TemporaryDirectory(prefix="reef-wrk-") as tmp:
        script = Path(tmp) / "round.lua"
        script.write_text(lua_script(slash + rest, headers, body, seconds))
        argv = [
            *(wrk, f"-c{concurrency}", f"-t{count}", f"-d{duration}s"),
            *(f"--timeout={TIMEOUT_SECONDS}s", "-s", str(script), f"{prefix}://{host}/"),
        ]
        # The servers are children too, but only reaped ones count: this is wrk's CPU.
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(process.communicate(), duration + 30.0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise RuntimeError(f"wrk exited {process.returncode}: {err.decode()[-500:]}")
    try:
        done = parse_output(out.decode(), concurrency)
    except ValueError as exc:
        raise ValueError(f"{exc}; wrk's stderr: {err.decode()[-500:]}") from exc
    result = done.to_result(target, concurrency)
    result.loader_cpu_seconds = (after.ru_utime + after.ru_stime) - (
        before.ru_utime + before.ru_stime
    )
    return result

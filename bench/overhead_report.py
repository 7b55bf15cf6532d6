"""Figures and markdown for ``bench/gateway_overhead.py``.

Every figure is the median over runs, with the range ``(min..max)`` when there is more
than one run. Differences and ratios are taken within a run (same minute, same noise)
before the median is taken.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from contenders import LITELLM_VERSION
from load import LoadResult
from sections import write_between
from wrk_load import warmup_seconds

START = "<!-- gateway_overhead:start -->"
END = "<!-- gateway_overhead:end -->"
# Issue 19, item 11: at the lowest concurrency Reef adds at most 1 ms p50 and at most
# twice what the bare passthrough adds, and at most 2 ms p99; at the highest it serves
# at least 0.7x the passthrough's throughput. Capture on, ``sync`` durability.
TARGET_ADDED_P50_MS = 1.0
TARGET_ADDED_P50_VS_PASSTHROUGH = 2.0
TARGET_ADDED_P99_MS = 2.0
TARGET_THROUGHPUT_VS_PASSTHROUGH = 0.7
# Issue 42: with prices, budgets and rate limits on (*reef-spend-on*, ``--spend``) Reef
# adds at most 0.1 ms p50 at the lowest concurrency and keeps 0.95x its throughput at the
# highest, against the same Reef with them off.
TARGET_SPEND_ADDED_P50_MS = 0.1
TARGET_SPEND_THROUGHPUT = 0.95
# Issue 45: at the highest concurrency Reef's p99 is at most 1.5x the passthrough's in
# the same run (both with as many processes, ``--workers``).
TARGET_P99_VS_PASSTHROUGH = 1.5
_ORDER = (
    "direct",
    "passthrough",
    "reef",
    "reef-responses",
    "reef-capture-off",
    "reef-spend-on",
    "litellm",
)
_HOW_TO_READ = (
    "How to read it: every request is the same small non-streaming chat completion "
    "(the body and headers the OpenAI Python SDK sends), answered at once by a fake "
    "upstream, so the figures are pure proxy cost, not model time. *direct* is the "
    "client talking to the fake upstream; *passthrough* adds one bare aiohttp hop that "
    "parses nothing and records nothing, the floor for any proxy in Python; *reef* is the "
    "gateway with capture on and `sync` durability (a response completes only after its "
    "record is committed to its store, SQLite unless the Store line says otherwise); "
    "*litellm* is the LiteLLM proxy with no database, "
    "callbacks or telemetry; *reef-responses* is the same request sent to the same Reef as "
    "an OpenAI Responses request (`POST /v1/responses`: `instructions` and `input`), "
    "translated onto the fake's chat completions and its response kept for "
    "`previous_response_id`. Added latency is a target's latency minus direct's at "
    "concurrency 1: the cost one caller sees per call. Throughput at the highest "
    "concurrency is a closed loop on a shared machine: the load generator, the proxy and "
    "the fake upstream all compete for the same cores, so absolute req/s are a property "
    "of this machine and only the ratios carry over. A real model call takes hundreds "
    "of milliseconds, so a gateway's added milliseconds are what matter to an agent, and "
    "its req/s ceiling is what matters to a fleet. *CPU µs/request* is the serving "
    "process's user and system CPU over a measured round divided by its answers (for "
    "*direct*, the fake upstream's; for *litellm*, its proxy process's): on a shared "
    "machine it moves less than req/s from run to run."
)

_WHERE_IT_GOES = (
    "Where Reef's time goes (py-spy and per-stage timers on this machine, 2026-12): at "
    "concurrency 1, about 0.1 ms is the SQLite commit of the record before the answer "
    "(`sync` durability; a record touches the table and its five indexes; six and ~10 "
    "WAL frames before migration 0014), made on the event loop itself (the records a "
    "loop turn submits are one batch there; no hand-off to the writer thread and back "
    "unless the store is busy); about 0.05 ms "
    "is reading, checking, hashing and planning the request; the rest is the upstream "
    "call and uvicorn's HTTP handling, as in any Python proxy. The WAL is copied into the"
    " database (checkpointed) by a thread of its own, never by a commit a response waits "
    "for (`reef.experience.sql.wal`). Until 2026-12-05 SQLite's autocheckpoint did it "
    "inside the commit that took the WAL past 4000 pages, on the event loop: in c=32 runs"
    " of this bench (per-commit timers in the gateway), 15 of ~1400 loop commits "
    "checkpointed, 18-59 ms each with every request in flight waiting, the loop's longest"
    " stalls and Reef's p99 there. Now a PASSIVE pass every 200 records copies while "
    "commits go on, and past 128 MB of WAL a RESTART holds this process's commits for "
    "7-27 ms (the loop's records go to the writer thread meanwhile) so that the WAL "
    "starts over, about once per 20,000 records here. Over 13 such runs (2026-12-05, load"
    " average 3-7 on the 2 cores) 6 of ~18,000 loop commits took over 15 ms (17-32 ms), "
    "none during a checkpoint, each preempted by other processes; in 13 runs before, "
    "15-17 per run did, 15 of them checkpoints. Python's garbage collector is not in the "
    "tail: its full collections (20-150 ms) come only at start-up, before the gateway "
    "freezes what is alive then (`gc.freeze`); under load it makes young collections of "
    "~0.2 ms and, per 13,200 requests, ~75 of the middle generation of ~1 ms. At "
    "concurrency 32 Reef's CPU per request bounds the throughput. Until 2026-12-02 a "
    "quarter to a third of it was aiohttp's client call upstream: ~100-155 µs of CPU per "
    "call, measured alone against the same fake upstream, where Reef's own HTTP/1.1 "
    "client for complete answers (`reef.upstream.h1`, keep-alive connections over "
    "httptools' parser) costs ~36-40 µs. In one A/B run on this machine, alternating "
    "rounds of 4000 requests at c=32, Reef's CPU per request fell from 600-665 µs to "
    "413-470 µs with it (the passthrough's: 325-370 µs), and its throughput went from "
    "~0.6x to ~0.85x the passthrough's. Of what is left, capture (building the record and"
    " its SQLite write) is ~130 µs: Reef with `x-reef-capture: off` spent 270-330 µs, "
    "less than the passthrough. The rest is uvicorn and asyncio outside Reef's code, and "
    "Reef's own reading, checks and hashing. A Responses request's response state (for "
    "`previous_response_id`) is written in its record's transaction; its extra cost is "
    "translating the request and the answer."
)


@dataclass(frozen=True)
class RecordCheck:
    """Reef's records in its store against the requests sent through it."""

    sent: int
    receipts: int
    records: int
    sampled: int
    sample_found: int

    @property
    def ok(self) -> bool:
        """Every request was answered with a receipt and committed."""
        return self.sent == self.receipts == self.records and self.sample_found == self.sampled


def progress_line(run: int, result: LoadResult) -> str:
    """One line per measured round, printed as the benchmark goes."""
    return (
        f"run {run + 1}  c={result.concurrency:<3} {result.target:<14}"
        f" p50 {result.percentile(0.5):7.2f} ms  p99 {result.percentile(0.99):7.2f} ms"
        f"  {result.throughput:8.0f} req/s  errors {len(result.errors)}"
        + _loader_cpu(result)
        + _store_cpu(result)
    )


def _loader_cpu(result: LoadResult) -> str:
    """wrk's CPU per answer in the round, when known (not in the tables: a check that
    the load generator leaves the cores to the servers)."""
    if result.loader_cpu_seconds is None or not result.latencies_ms:
        return ""
    return f"  wrk CPU {result.loader_cpu_seconds * 1e6 / len(result.latencies_ms):.0f} µs/req"


def _store_cpu(result: LoadResult) -> str:
    """The PostgreSQL server's CPU per answer in the round, when measured."""
    per_request = result.store_cpu_us_per_request
    return "" if per_request is None else f"  PostgreSQL CPU {per_request:.0f} µs/req"


def spread(values: list[float], digits: int = 2) -> str:
    """``median`` or ``median (min..max)``."""
    if not values:
        return "n/a"
    middle = f"{statistics.median(values):.{digits}f}"
    if len(values) == 1:
        return middle
    return f"{middle} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def machine() -> str:
    """Cores, CPU model, Python and kernel."""
    model = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} cores, {model}, Python {platform.python_version()}, "
        f"Linux {platform.release()}"
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


@dataclass
class Report:
    """The measured rounds turned into a table and derived figures."""

    command: str
    args: argparse.Namespace
    results: list[LoadResult]
    records: RecordCheck
    litellm_note: str | None
    failed: dict[str, str] = field(default_factory=dict)
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)  # os.getloadavg() at start
    load_after: tuple[float, float, float] | None = None  # and at the end
    store: str = "SQLite"  # where Reef's records went (``--store``)
    date: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    )

    def runs(self, target: str, level: int) -> list[LoadResult]:
        """The rounds of ``target`` at ``level``, in run order."""
        return [r for r in self.results if r.target == target and r.concurrency == level]

    def targets(self) -> list[str]:
        present = {r.target for r in self.results}
        return [name for name in _ORDER if name in present]

    def paired(
        self, target: str, base: str, level: int, value: Callable[[LoadResult, LoadResult], float]
    ) -> list[float]:
        """``value(target_round, base_round)`` for each run both completed."""
        pairs = zip(self.runs(target, level), self.runs(base, level), strict=False)
        return [value(mine, theirs) for mine, theirs in pairs]

    def added(self, target: str, fraction: float) -> list[float]:
        """Latency added over direct at the lowest concurrency, per run (ms)."""
        level = self.args.concurrency[0]
        return self.paired(
            target, "direct", level, lambda a, b: a.percentile(fraction) - b.percentile(fraction)
        )

    def throughput_ratio(self, target: str, base: str) -> list[float]:
        """Throughput of ``target`` over ``base`` at the highest concurrency, per run."""
        level = self.args.concurrency[-1]
        return self.paired(target, base, level, lambda a, b: a.throughput / b.throughput)

    def table(self) -> list[str]:
        lines = [
            "| target | concurrency | p50 ms | p99 ms | req/s | CPU µs/request | errors |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for level in self.args.concurrency:
            for target in self.targets():
                rounds = self.runs(target, level)
                lines.append(
                    f"| {target} | {level} | {spread([r.percentile(0.5) for r in rounds])} "
                    f"| {spread([r.percentile(0.99) for r in rounds])} "
                    f"| {spread([r.throughput for r in rounds], 0)} "
                    f"| {self._cpu(target, level)} "
                    f"| {sum(len(r.errors) for r in rounds)} |"
                )
        return lines

    def _cpu(self, target: str, level: int) -> str:
        """The serving process's CPU per request over the runs (direct: the fake's)."""
        values = [r.cpu_us_per_request for r in self.runs(target, level)]
        known = [v for v in values if v is not None]
        return spread(known, 0) if known else "n/a"

    def derived(self) -> list[str]:
        low, high = self.args.concurrency[0], self.args.concurrency[-1]
        others = [t for t in self.targets() if t != "direct"]
        lines = [f"- Added latency vs direct at c={low} (ms):"]
        lines += [
            f"  - {t}: p50 +{spread(self.added(t, 0.5))}, p99 +{spread(self.added(t, 0.99))}, "
            f"p99.9 +{spread(self.added(t, 0.999))}"
            for t in others
        ]
        lines.append(f"- Throughput at c={high} (req/s):")
        for target in self.targets():
            thr = spread([r.throughput for r in self.runs(target, high)], 0)
            vs = ""
            if target != "direct":
                vs = f" = {spread(self.throughput_ratio(target, 'direct'))}x direct"
            if target not in ("direct", "passthrough"):
                vs += f", {spread(self.throughput_ratio(target, 'passthrough'))}x passthrough"
            lines.append(f"  - {target}: {thr}{vs}")
        cpu = [v for v in self.paired("reef", "passthrough", high, _cpu_ratio) if v == v]
        if cpu:
            lines.append(
                f"- CPU per request at c={high}: Reef's process spends "
                f"{self._cpu('reef', high)} µs, the passthrough's {self._cpu('passthrough', high)}"
                f" µs: {spread(cpu)}x (the proxy's own cost, steadier than req/s on a "
                "shared machine)."
            )
        measured = [
            (v, v + (r.cpu_us_per_request or 0.0))
            for r in self.runs("reef", high)
            if (v := r.store_cpu_us_per_request) is not None
        ]
        if measured:
            store_cpu, both = [v for v, _ in measured], [t for _, t in measured]
            lines.append(
                f"- {self.store} server CPU per Reef request at c={high}: {spread(store_cpu, 0)}"
                f" µs (its postmaster and backends, on the same machine); Reef's and the "
                f"server's together {spread(both, 0)} µs."
            )
        if {"reef", "litellm"} <= set(self.targets()):
            slower = self.paired(
                "litellm", "reef", low, lambda a, b: a.percentile(0.5) / b.percentile(0.5)
            )
            lines.append(
                f"- LiteLLM vs Reef: LiteLLM's added p50 is "
                f"{spread(self._overhead_ratio())}x Reef's; its p50 is {spread(slower)}x "
                f"Reef's at c={low}; Reef serves {spread(self.throughput_ratio('reef', 'litellm'))}"
                f"x LiteLLM's throughput at c={high}."
            )
        return (
            lines
            + self._responses_lines()
            + self.verdicts()
            + self._capture_lines()
            + self._spend_lines()
        )

    def _responses_lines(self) -> list[str]:
        """The Responses route next to chat completions, both through Reef."""
        if not {"reef", "reef-responses"} <= set(self.targets()):
            return []
        low, high = self.args.concurrency[0], self.args.concurrency[-1]
        parts = []
        for name, fraction in (("p50", 0.5), ("p99", 0.99)):
            mine, chat = self.added("reef-responses", fraction), self.added("reef", fraction)
            times = [a / b if b > 0 else float("inf") for a, b in zip(mine, chat, strict=False)]
            parts.append(f"{name} +{spread(mine)} vs +{spread(chat)} ms ({spread(times)}x)")
        ratio = self.paired(
            "reef-responses", "reef", high, lambda a, b: a.throughput / b.throughput
        )
        return [
            f"- Responses vs chat completions, both through Reef: added latency at c={low} "
            f"{'; '.join(parts)}; throughput at c={high} {spread(ratio)}x chat completions."
        ]

    def _capture_lines(self) -> list[str]:
        """*reef-capture-off* against *reef* and the passthrough at the highest
        concurrency: how much of Reef's tail and CPU per request is capture, per run."""
        if not {"reef", "reef-capture-off", "passthrough"} <= set(self.targets()):
            return []
        high = self.args.concurrency[-1]
        off = self.paired("reef-capture-off", "passthrough", high, _p99_ratio)
        on = self.paired("reef", "passthrough", high, _p99_ratio)
        capture = [v for v in self.paired("reef", "reef-capture-off", high, _cpu_minus) if v == v]
        rest = [
            v for v in self.paired("reef-capture-off", "passthrough", high, _cpu_minus) if v == v
        ]
        line = (
            f"- Capture off (reef-capture-off) vs on (reef) at c={high}: p99 {spread(off)}x "
            f"the passthrough's in the same run, against {spread(on)}x with capture"
        )
        if capture and rest:
            line += (
                f"; CPU per request: capture {spread(capture, 0)} µs; Reef without it "
                f"{_signed(rest, 0)} µs beside the passthrough"
            )
        return [line + "."]

    def _spend_lines(self) -> list[str]:
        """*reef-spend-on* against *reef*: added p50 at the lowest concurrency and the
        throughput ratio at the highest, each taken within a run."""
        if not {"reef", "reef-spend-on"} <= set(self.targets()):
            return []
        low, high = self.args.concurrency[0], self.args.concurrency[-1]
        added = self.paired(
            "reef-spend-on", "reef", low, lambda a, b: a.percentile(0.5) - b.percentile(0.5)
        )
        ratio = self.throughput_ratio("reef-spend-on", "reef")
        cpu = [v for v in self.paired("reef-spend-on", "reef", high, _cpu_ratio) if v == v]
        lines = [
            f"- Budgets and rate limits on (reef-spend-on) vs off (reef): p50 at c={low} "
            f"{_signed(added)} ms (per run: {', '.join(f'{d:+.3f}' for d in added)}); "
            f"throughput at c={high} {spread(ratio, 3)}x (per run: "
            f"{', '.join(f'{r:.3f}' for r in ratio)})"
            + (f"; CPU per request at c={high} {spread(cpu, 3)}x." if cpu else ".")
        ]
        if added:
            met = statistics.median(added) <= TARGET_SPEND_ADDED_P50_MS
            lines.append(
                f"- Target: budgets and rate limits add ≤ {TARGET_SPEND_ADDED_P50_MS:g} ms p50 "
                f"at c={low}: **{_verdict(met)}** ({_signed(added)} ms)."
            )
        if ratio:
            met = statistics.median(ratio) >= TARGET_SPEND_THROUGHPUT
            lines.append(
                f"- Target: with budgets and rate limits ≥ {TARGET_SPEND_THROUGHPUT:g}x the "
                f"throughput without at c={high}: **{_verdict(met)}** ({spread(ratio, 3)}x)."
            )
        return lines

    def _overhead_ratio(self) -> list[float]:
        return [
            lite / reef if reef > 0 else float("inf")
            for lite, reef in zip(self.added("litellm", 0.5), self.added("reef", 0.5), strict=False)
        ]

    def verdicts(self) -> list[str]:
        low = self.args.concurrency[0]
        added = self.added("reef", 0.5)
        floor = self.added("passthrough", 0.5)
        tail = self.added("reef", 0.99)
        ratio = self.throughput_ratio("reef", "passthrough")
        lines = []
        if added:
            met = statistics.median(added) <= TARGET_ADDED_P50_MS
            lines.append(
                f"- Target: Reef adds ≤ {TARGET_ADDED_P50_MS:g} ms p50 at c={low}: "
                f"**{_verdict(met)}** (+{spread(added)} ms)."
            )
        if added and floor:
            times = [mine / theirs if theirs > 0 else float("inf")
                     for mine, theirs in zip(added, floor, strict=False)]  # fmt: skip
            met = statistics.median(times) <= TARGET_ADDED_P50_VS_PASSTHROUGH
            lines.append(
                f"- Target: Reef adds ≤ {TARGET_ADDED_P50_VS_PASSTHROUGH:g}x the passthrough's "
                f"added p50 at c={low}: **{_verdict(met)}** ({spread(times)}x)."
            )
        if tail:
            met = statistics.median(tail) <= TARGET_ADDED_P99_MS
            lines.append(
                f"- Target: Reef adds ≤ {TARGET_ADDED_P99_MS:g} ms p99 at c={low}: "
                f"**{_verdict(met)}** (+{spread(tail)} ms)."
            )
        if ratio:
            met = statistics.median(ratio) >= TARGET_THROUGHPUT_VS_PASSTHROUGH
            lines.append(
                f"- Target: Reef ≥ {TARGET_THROUGHPUT_VS_PASSTHROUGH:g}x passthrough throughput "
                f"at c={self.args.concurrency[-1]}: **{_verdict(met)}** ({spread(ratio)}x)."
            )
        high = self.args.concurrency[-1]
        tail_ratio = self.paired("reef", "passthrough", high, _p99_ratio)
        if tail_ratio:
            met = statistics.median(tail_ratio) <= TARGET_P99_VS_PASSTHROUGH
            lines.append(
                f"- Target: Reef's p99 ≤ {TARGET_P99_VS_PASSTHROUGH:g}x the passthrough's at "
                f"c={high} in the same run: **{_verdict(met)}** ({spread(tail_ratio)}x)."
            )
        rc = self.records
        lines.append(
            f"- Capture check: {rc.records} records in Reef's {self.store} for {rc.sent} requests "
            f"sent through Reef (warm-ups included), {rc.receipts} receipts returned, "
            f"{rc.sample_found}/{rc.sampled} sampled receipts found: "
            f"**{'ok' if rc.ok else 'MISMATCH'}**."
        )
        return lines

    def notes(self) -> list[str]:
        lines = []
        if self.litellm_note:
            lines.append(f"- LiteLLM: {self.litellm_note}.")
        lines += [f"- {t} dropped: {why}" for t, why in self.failed.items() if t != "litellm"]
        return lines

    def markdown(self) -> str:
        a = self.args
        runs = f"median of {a.runs} runs (min..max)" if a.runs > 1 else "one run"
        litellm = "" if self.litellm_note else f", litellm {LITELLM_VERSION} (own venv)"
        load = ", ".join(f"{value:.2f}" for value in self.load_before)
        if self.load_after is not None:
            load += ", after it " + ", ".join(f"{value:.2f}" for value in self.load_after)
        return "\n".join(
            [
                "## Gateway overhead",
                "",
                f"Command: `{self.command}`",
                "",
                f"- Machine: {machine()}; {self.date}; load average before the run "
                f"{load} (1, 5, 15 min).",
                f"- Load: {_round_size(a)} (reef-responses: the same request as POST "
                f"/v1/responses"
                + (
                    "; reef-spend-on: Reef with a price, budgets and rate limits"
                    if getattr(a, "spend", False)
                    else ""
                )
                + (
                    "; reef-capture-off: Reef recording nothing"
                    if getattr(a, "capture_off", False)
                    else ""
                )
                + f"), concurrency {', '.join(map(str, a.concurrency))}; "
                f"{runs}; {loader_text(a)}.",
                f"- Store: Reef's records in {self._store_text()}, `sync` durability.",
                f"- Versions: reef {_version('reef-agent')}, aiohttp {_version('aiohttp')}, "
                f"uvicorn {_version('uvicorn')}{litellm}.",
                *self.notes(),
                "",
                *self.table(),
                "",
                *self.derived(),
                "",
                _HOW_TO_READ,
                "",
                _WHERE_IT_GOES,
            ]
        )

    def _store_text(self) -> str:
        """The store, and where it ran."""
        if self.store == "SQLite":
            return "SQLite (a file in a temporary directory)"
        return f"{self.store} (a database of the bench's own on a server on this machine)"

    def text(self) -> str:
        """What is printed at the end: the same as the markdown section."""
        return self.markdown()


def _round_size(args: argparse.Namespace) -> str:
    """How long a round is: a count (Python loader) or a time (wrk)."""
    if getattr(args, "loader", "python") != "wrk":
        return f"{args.requests} non-streaming chat requests per round after {args.warmup} warm-up"
    warmup = warmup_seconds(args.warmup, args.requests, args.seconds)
    after = f"after a {warmup:g} s warm-up" if warmup else "without warm-up"
    if args.seconds:
        return f"non-streaming chat requests for {args.seconds:g} s per round, {after}"
    return (
        f"non-streaming chat requests per round for as long as {args.requests} take at the "
        f"warm-up's pace (1-120 s), {after}"
    )


def wrk_version() -> str:
    """``wrk -v``'s first words (``wrk 4.1.0``), or ``wrk`` when it cannot say."""
    try:
        done = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "wrk"
    words = (done.stdout or done.stderr).split()
    return " ".join(words[:2]) if words[:1] == ["wrk"] else "wrk"


def loader_text(args: argparse.Namespace) -> str:
    """Which load generator sent the requests, said in the report."""
    if getattr(args, "loader", "python") != "wrk":
        return "load from Python: one aiohttp client session with keep-alive"
    return (
        f"load from {wrk_version()} (native; {args.wrk_threads} thread(s) at most, "
        "keep-alive, its Lua script counting requests, 2xx answers and receipts)"
    )


def _cpu_ratio(a: LoadResult, b: LoadResult) -> float:
    """``a``'s CPU per request over ``b``'s (NaN when either is unknown)."""
    x, y = a.cpu_us_per_request, b.cpu_us_per_request
    return x / y if x is not None and y else math.nan  # NaN: left out by the caller


def _cpu_minus(a: LoadResult, b: LoadResult) -> float:
    """``a``'s CPU per request minus ``b``'s, in µs (NaN when either is unknown)."""
    x, y = a.cpu_us_per_request, b.cpu_us_per_request
    return x - y if x is not None and y is not None else math.nan


def _p99_ratio(a: LoadResult, b: LoadResult) -> float:
    """``a``'s p99 over ``b``'s, within one run."""
    theirs = b.percentile(0.99)
    return a.percentile(0.99) / theirs if theirs > 0 else math.inf


def _signed(values: list[float], digits: int = 3) -> str:
    """``spread`` of differences, signed (to the microsecond when they are ms)."""
    middle = f"{statistics.median(values):+.{digits}f}"
    if len(values) == 1:
        return middle
    return f"{middle} ({min(values):+.{digits}f}..{max(values):+.{digits}f})"


def _verdict(met: bool) -> str:
    return "met" if met else "missed"


def write_section(path: Path, section: str) -> None:
    """Replace this bench's section of ``path`` (appended when absent)."""
    write_between(path, START, END, section)

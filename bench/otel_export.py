"""Live OTel export's cost: Reef's gateway throughput at concurrency 32 with ``otel``
export on and off, side by side in one run.

    .venv/bin/python bench/otel_export.py --requests 2000 --concurrency 32 --runs 3 \
        --output docs/benchmarks.md

One run starts, as separate processes on loopback: the fake upstream
(``tests.fakes.upstream``), a real OTLP/HTTP receiver (``tests.fakes.otlp``: it parses
every ``ExportTraceServiceRequest``), and two ``reef serve`` (capture on, ``sync``
durability, SQLite each): *reef-otel-off* without export and *reef-otel-on* sending one
span per exchange to the receiver (the defaults: batches of 512, content off). It also
reports the spans the gateway dropped and the export process's CPU per span.
The same non-streaming chat requests (``bench/load.py``, as in
``bench/gateway_overhead.py``) go to both after a warm-up, rounds alternating; the
report gives each one's throughput, p50/p99 and CPU per request, and the ratio on/off
(median over runs; issue 40's target is at least 0.95). Afterwards the receiver's span
count is checked against the requests sent to *reef-otel-on*.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import NoReturn

from contenders import (
    ChildProcesses,
    Server,
    StartError,
    child_env,
    free_port,
    start_upstream,
    wait_ready,
)
from gateway_overhead import process_cpu_seconds
from load import LoadResult, client_session, drive, sdk_headers
from sections import write_between

START, END = "<!-- otel_export:start -->", "<!-- otel_export:end -->"
TARGETS = ("reef-otel-off", "reef-otel-on")
_LOOPBACK = "127.0.0.1"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000, help="measured per round")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured, before each round")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3, help="rounds per target, alternating")
    parser.add_argument("--note", default="", help="a line about the machine, for the report")
    parser.add_argument("--output", type=Path, help="markdown file whose section to rewrite")
    args = parser.parse_args(argv)
    if min(args.requests, args.runs, args.concurrency) < 1:
        parser.error("--requests, --runs and --concurrency must be at least 1")
    return args


def start_receiver(children: ChildProcesses) -> tuple[str, str, int]:
    """The OTLP receiver: its traces URL, its span-count URL and its pid."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.fakes.otlp", "--port", str(port)]
    process, log = children.spawn("otlp", argv, child_env())
    count_url = f"http://{_LOOPBACK}:{port}/healthz"
    wait_ready(process, log, count_url, 30)
    return f"http://{_LOOPBACK}:{port}/v1/traces", count_url, process.pid


def start_gateway(
    children: ChildProcesses, name: str, upstream: str, workdir: Path, traces_url: str | None
) -> Server:
    """``reef serve`` with capture on (``sync``), live export to ``traces_url`` if given."""
    port = free_port()
    home = workdir / name
    home.mkdir()
    otel = f"otel: {{enabled: true, endpoint: {traces_url!r}}}\n" if traces_url else ""
    config = home / "reef.yaml"
    config.write_text(
        f"home: {home / 'home'}\n"
        f"server: {{port: {port}}}\n"
        f'store: {{url: "sqlite:///{home / "reef.db"}", durability: sync}}\n'
        f"upstreams: {{fake: {{type: openai, base_url: {upstream!r}, model: fake-model}}}}\n" + otel
    )
    argv = [sys.executable, "-m", "reef", "serve", "-c", str(config), "--log-level", "WARNING"]
    argv += ["--no-worker"]
    process, log = children.spawn(name, argv, child_env())
    wait_ready(process, log, f"http://{_LOOPBACK}:{port}/healthz", 60)
    return Server(name, f"http://{_LOOPBACK}:{port}/v1", process, log)


async def measure(servers: list[Server], args: argparse.Namespace) -> list[LoadResult]:
    """Warm-up then a measured round per run and target, the order alternating."""
    results: list[LoadResult] = []
    headers = sdk_headers("sk-bench")
    limit = 60.0 + 0.1 * (args.requests + args.warmup)
    async with client_session(args.concurrency) as session:
        for run in range(args.runs):
            order = servers if run % 2 == 0 else servers[::-1]
            for server in order:
                for count in (args.warmup, args.requests):
                    cpu_before = process_cpu_seconds(server.process.pid)
                    result = await drive(
                        session, server.name, server.chat_url, headers, args.concurrency,
                        count, limit,
                    )  # fmt: skip
                    result.cpu_seconds = process_cpu_seconds(server.process.pid) - cpu_before
                results.append(result)
                print(
                    f"run {run + 1} {server.name:14} {result.throughput:8.1f} req/s  "
                    f"p50 {result.percentile(0.5):6.1f} ms  p99 {result.percentile(0.99):6.1f} ms",
                    flush=True,
                )
    return results


def spans_received(count_url: str, expected: int, wait_seconds: float = 15.0) -> int:
    """The receiver's span count once it reaches ``expected`` (or the wait is over)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        with _OPENER.open(count_url, timeout=5) as response:
            count = int(response.read())
        if count >= expected or time.monotonic() > deadline:
            return count
        time.sleep(0.2)


def export_process_cpu(server: Server) -> float:
    """CPU seconds so far of ``server``'s child processes (its OTel export process)."""
    total = 0.0
    for task in Path(f"/proc/{server.process.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total += process_cpu_seconds(int(child))
    return total


def settled_cpu(server: Server, limit_seconds: float = 60.0) -> float:
    """The export process's CPU once its start-up is over (two readings half a second
    apart agree: it waits on its input), so that it is not counted per span."""
    deadline = time.monotonic() + limit_seconds
    before = export_process_cpu(server)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = export_process_cpu(server)
        if now == before:
            break
        before = now
    return before


def dropped_spans(server: Server) -> int:
    """``reef_otel_spans_dropped_total`` of ``server``'s ``/metrics``: spans the gateway's
    queue dropped (full, or the export process gone)."""
    url = server.base_url.removesuffix("/v1") + "/metrics"
    with _OPENER.open(url, timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("reef_otel_spans_dropped_total"):
            return int(float(line.split()[-1]))
    return 0


def report(
    args: argparse.Namespace,
    argv: list[str],
    results: list[LoadResult],
    spans: tuple[int, int],
    sent_on: int,
    load: tuple[float, float],
    side_cpu: tuple[float, float],
) -> str:
    """The markdown section: per-target medians, the ratio, the span check."""
    by_target = {name: [r for r in results if r.target == name] for name in TARGETS}
    ratios = [
        on.throughput / off.throughput
        for off, on in zip(by_target["reef-otel-off"], by_target["reef-otel-on"], strict=True)
    ]
    ratio = statistics.median(ratios)
    lines = [
        "## Live OTel export: throughput with export on vs off",
        "",
        f"`{shlex.join(['python', 'bench/otel_export.py', *argv])}`",
        "",
        f"Concurrency {args.concurrency}, {args.requests} measured non-streaming chat requests "
        f"per round after {args.warmup} warm-up, {args.runs} round(s) per target, alternating; "
        f"medians over rounds. Load average before/after: {load[0]:.2f} / {load[1]:.2f}. "
        + (args.note or ""),
        "",
        "| target | req/s | p50 ms | p99 ms | CPU µs/req |",
        "|---|---|---|---|---|",
    ]
    for name, rounds in by_target.items():
        cpu = [r.cpu_us_per_request or 0.0 for r in rounds]
        lines.append(
            f"| {name} | {statistics.median(r.throughput for r in rounds):.1f} "
            f"| {statistics.median(r.percentile(0.5) for r in rounds):.1f} "
            f"| {statistics.median(r.percentile(0.99) for r in rounds):.1f} "
            f"| {statistics.median(cpu):.0f} |"
        )
    verdict = "meets" if ratio >= 0.95 else "misses"
    lines += [
        "",
        f"Throughput on/off: **{ratio:.3f}x** (per round: "
        f"{', '.join(f'{r:.3f}' for r in ratios)}); {verdict} the 0.95x target.",
        f"Spans received by the OTLP receiver: {spans[0]} of {sent_on} requests sent to "
        f"reef-otel-on (warm-ups included); dropped by the gateway's queue: {spans[1]}. "
        f"While measuring, the export process used {side_cpu[0]:.2f} s of CPU, "
        f"{side_cpu[0] / max(spans[0], 1) * 1e6:.0f} µs per span received, and the receiver "
        f"{side_cpu[1]:.2f} s, {side_cpu[1] / max(spans[0], 1) * 1e6:.0f} µs per span.",
    ]
    return "\n".join(lines)


def _stop_on_sigterm(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    """Start the servers, measure, check the spans, report; stop the servers."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="reef-otel-") as tmp:
        children = ChildProcesses(Path(tmp))
        try:
            upstream = start_upstream(children)
            traces_url, count_url, receiver = start_receiver(children)
            servers = [
                start_gateway(children, "reef-otel-off", upstream.base_url, Path(tmp), None),
                start_gateway(children, "reef-otel-on", upstream.base_url, Path(tmp), traces_url),
            ]
            export_cpu_before = settled_cpu(servers[1])
            receiver_cpu = process_cpu_seconds(receiver)
            results = asyncio.run(measure(servers, args))
            sent_on = args.runs * (args.requests + args.warmup)
            spans = (spans_received(count_url, sent_on), dropped_spans(servers[1]))
            export_cpu = export_process_cpu(servers[1]) - export_cpu_before
            receiver_cpu = process_cpu_seconds(receiver) - receiver_cpu
            print(f"spans received {spans[0]} of {sent_on} sent, dropped {spans[1]}", flush=True)
        except StartError as exc:
            print(f"could not start a server: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted: every server stopped", file=sys.stderr)
            return 130
        finally:
            children.stop_all()
    load = (load_before, os.getloadavg()[0])
    text = report(args, argv, results, spans, sent_on, load, (export_cpu, receiver_cpu))
    print(text)
    if args.output is not None:
        write_between(args.output, START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

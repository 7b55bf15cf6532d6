"""The shadow arm's cost to the client: Reef's gateway at concurrency 1 and 32 with an
evaluating candidate shadowed vs no shadow, side by side in one run.

    .venv/bin/python bench/shadow_overhead.py --requests 2000 --runs 3 --output docs/benchmarks.md

One run starts, as separate processes on loopback: the fake upstream
(``tests.fakes.upstream``) and ``reef serve`` per target (capture on, ``sync``
durability unless ``--durability async``, SQLite each, ``bench/contenders.py``):
*reef-shadow-off*, whose scenario has no evaluating candidate, and one
*reef-shadow-<fraction>* per ``--fractions`` (default 1 and 0.1: the worst case and the
default of ``gate.shadow.fraction``), where a candidate of the ``default`` scenario (the
head's own manifest, so it asks the same fake upstream) is ``evaluating`` with the
``gate.shadow`` settings the gate stores on it (``with_shadow_settings``): that
fraction of live requests, ``--shadow-concurrency`` calls in flight (default 2, the
setting's default; a sampled request beyond it is dropped) and no cap worth the name
(``max_requests`` 10^9, so every round is shadowed).
The same non-streaming chat requests (``bench/load.py``) go to every target after a
warm-up, the order rotating per round; the report gives p50 and p99 on minus off, the
throughput ratio on/off (medians over rounds) and the shadow samples per round from
``/metrics`` (``reef_shadow_requests_total``). That the client's bytes are the same is a
test (``tests/evaluation/test_shadow.py``), not this bench.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from contenders import ChildProcesses, Server, StartError, start_reef, start_upstream
from gateway_overhead import process_cpu_seconds
from load import CHAT_BODY, LoadResult, client_session, drive, sdk_headers
from sections import write_between

from reef.evaluation import ShadowConfig
from reef.evaluation.shadow import with_shadow_settings
from reef.experience import open_store
from reef.releases import ReleaseChain

START, END = "<!-- shadow_overhead:start -->", "<!-- shadow_overhead:end -->"
OFF = "reef-shadow-off"
SCENARIO = "default"
_METRIC = re.compile(
    r'^reef_shadow_requests_total\{outcome="(\w+)",scenario="' + SCENARIO + r'"\} ([0-9.e+]+)$',
    re.MULTILINE,
)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000, help="measured per round")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured, before each round")
    parser.add_argument("--concurrency", default="1,32", help="comma-separated levels")
    parser.add_argument("--runs", type=int, default=3, help="rounds per target, alternating")
    parser.add_argument(
        "--fractions", default="1,0.1", help="gate.shadow.fraction per shadowed gateway"
    )
    parser.add_argument("--shadow-concurrency", type=int, default=2, help="gate.shadow.concurrency")
    parser.add_argument(
        "--durability", choices=("sync", "async"), default="sync", help="store.durability"
    )
    parser.add_argument("--note", default="", help="a line about the machine, for the report")
    parser.add_argument("--output", type=Path, help="markdown file whose section to rewrite")
    args = parser.parse_args(argv)
    args.concurrency = sorted({int(level) for level in args.concurrency.split(",")})
    if min(args.requests, args.runs, args.concurrency[0]) < 1:
        parser.error("--requests, --runs and every concurrency must be at least 1")
    args.fractions = sorted({float(f) for f in args.fractions.split(",")}, reverse=True)
    if not all(0.0 < f <= 1.0 for f in args.fractions):
        parser.error("every --fractions value must be in (0, 1]")
    if not 1 <= args.shadow_concurrency <= 64:
        parser.error("--shadow-concurrency must be in [1, 64]")
    return args


def first_request(server: Server) -> None:
    """One chat request: the gateway creates the scenario's head on its first one."""
    request = urllib.request.Request(
        server.chat_url, data=CHAT_BODY % 0, headers=sdk_headers("sk-bench"), method="POST"
    )
    with _OPENER.open(request, timeout=30) as response:
        if response.status != 200:
            raise StartError(f"{server.name}: the first request answered {response.status}")


def make_evaluating(database: Path, config: ShadowConfig) -> str:
    """Propose a candidate equal to the ``default`` scenario's head and move it to
    ``evaluating`` with ``config`` stored as the gate stores it; its id."""
    store = open_store(f"sqlite:///{database}")
    try:
        chain = ReleaseChain(store.database)
        head = chain.head(SCENARIO)
        if head is None:
            raise StartError(f"the gateway made no head for scenario {SCENARIO!r}")
        candidate = chain.propose(
            SCENARIO, head.manifest, head.id, "bench", "shadow_overhead: the head's manifest"
        )
        evidence = with_shadow_settings(candidate.evidence, config)
        chain.set_candidate_state(candidate.id, "evaluating", evidence)
        return candidate.id
    finally:
        store.close()


def wait_shadowing(server: Server, limit: float = 30.0) -> None:
    """Send requests until one is shadowed: the gateway reads the evaluating candidate
    from the chain at most every 5 seconds (``ShadowArm.refresh_seconds``)."""
    deadline = time.monotonic() + limit
    while not shadow_counts(server):
        if time.monotonic() > deadline:
            raise StartError(f"{server.name}: no request shadowed after {limit:.0f} s")
        first_request(server)
        time.sleep(0.1)


def shadow_counts(server: Server) -> Counter[str]:
    """``reef_shadow_requests_total`` of the ``default`` scenario, by outcome."""
    url = server.base_url.removesuffix("/v1") + "/metrics"
    with _OPENER.open(url, timeout=10) as response:
        text = response.read().decode()
    return Counter({outcome: int(float(value)) for outcome, value in _METRIC.findall(text)})


def shadowed(fraction: float) -> str:
    """The name of the gateway shadowing ``fraction`` of its live requests."""
    return f"reef-shadow-{fraction:g}"


Samples = dict[tuple[str, int, int], Counter[str]]  # (target, concurrency, run): outcomes


def rotations(servers: list[Server], runs: int) -> Iterator[tuple[int, list[Server]]]:
    """Each run's order of the targets: rotated by one per run."""
    for run in range(runs):
        shift = run % len(servers)
        yield run, servers[shift:] + servers[:shift]


async def measure(
    servers: list[Server], args: argparse.Namespace
) -> tuple[list[LoadResult], Samples]:
    """Per concurrency and run: warm-up then a measured round per target, rotating;
    also the shadow samples counted during each measured round."""
    results: list[LoadResult] = []
    samples: Samples = {}
    headers = sdk_headers("sk-bench")
    limit = 60.0 + 0.1 * (args.requests + args.warmup)
    for concurrency in args.concurrency:
        async with client_session(concurrency) as session:
            for run, order in rotations(servers, args.runs):
                for server in order:
                    result = await drive(
                        session, server.name, server.chat_url, headers, concurrency,
                        args.warmup, limit,
                    )  # fmt: skip
                    before = await asyncio.to_thread(shadow_counts, server)
                    cpu_before = process_cpu_seconds(server.process.pid)
                    result = await drive(
                        session, server.name, server.chat_url, headers, concurrency,
                        args.requests, limit,
                    )  # fmt: skip
                    result.cpu_seconds = process_cpu_seconds(server.process.pid) - cpu_before
                    counted = await asyncio.to_thread(shadow_counts, server)
                    counted.subtract(before)
                    samples[(server.name, concurrency, run)] = counted
                    results.append(result)
                    print(
                        f"c={concurrency} run {run + 1} {server.name:17} "
                        f"{result.throughput:8.1f} req/s  p50 {result.percentile(0.5):6.2f} ms"
                        f"  p99 {result.percentile(0.99):6.2f} ms  shadow {dict(+counted)}",
                        flush=True,
                    )
    return results, samples


def _per_round(values: list[float], form: str) -> str:
    return ", ".join(format(v, form) for v in values)


def _verdict(
    name: str, off: list[LoadResult], on: list[LoadResult], samples: list[Counter[str]]
) -> str:
    p50 = [b.percentile(0.5) - a.percentile(0.5) for a, b in zip(off, on, strict=True)]
    p99 = [b.percentile(0.99) - a.percentile(0.99) for a, b in zip(off, on, strict=True)]
    ratios = [b.throughput / a.throughput for a, b in zip(off, on, strict=True)]
    shadowed = ", ".join(
        "/".join(str(s[o]) for o in ("sent", "dropped", "failed")) for s in samples
    )
    return (
        f"- c={off[0].concurrency}, {name}: p50 on-off **{statistics.median(p50):+.3f} ms** "
        f"(per round: {_per_round(p50, '+.3f')}); p99 on-off "
        f"**{statistics.median(p99):+.3f} ms** (per round: {_per_round(p99, '+.3f')}); "
        f"throughput on/off **{statistics.median(ratios):.3f}x** (per round: "
        f"{_per_round(ratios, '.3f')}); shadow samples sent/dropped/failed per round: "
        f"{shadowed}; gateway CPU per shadow call sent **{_cpu_per_call(off, on, samples)}**."
    )


def _cpu_per_call(off: list[LoadResult], on: list[LoadResult], samples: list[Counter[str]]) -> str:
    """The gateway's extra CPU (on minus off, per round) over the shadow calls sent, in
    µs: the median over rounds (``n/a`` when a round sent none or lacks a CPU figure)."""
    per_call = []
    for a, b, counted in zip(off, on, samples, strict=True):
        if a.cpu_seconds is None or b.cpu_seconds is None or not counted["sent"]:
            return "n/a"
        per_call.append((b.cpu_seconds - a.cpu_seconds) * 1e6 / counted["sent"])
    return f"{statistics.median(per_call):.0f} µs"


def report(
    args: argparse.Namespace,
    argv: list[str],
    results: list[LoadResult],
    samples: Samples,
    load: tuple[float, float],
) -> str:
    """The markdown section: per concurrency and target, the medians; the figures."""
    targets = [OFF, *(shadowed(f) for f in args.fractions)]
    lines = [
        "## Shadow traffic: the gateway with an evaluating candidate shadowed vs not",
        "",
        f"`{shlex.join(['python', 'bench/shadow_overhead.py', *argv])}`",
        "",
        f"{args.requests} measured non-streaming chat requests per round after "
        f"{args.warmup} warm-up, {args.runs} round(s) per target and concurrency, the "
        f"order rotating; medians over rounds; `store.durability: {args.durability}`. "
        f"`gate.shadow` on *reef-shadow-<fraction>*: "
        f"that fraction, concurrency {args.shadow_concurrency}, no cap; the candidate asks "
        f"the same fake upstream. Load average before/after: {load[0]:.2f} / {load[1]:.2f}. "
        + (args.note or ""),
        "",
        "| concurrency | target | req/s | p50 ms | p99 ms | CPU µs/req |",
        "|---|---|---|---|---|---|",
    ]
    verdicts = []
    for concurrency in args.concurrency:
        by_target = {
            name: [r for r in results if r.target == name and r.concurrency == concurrency]
            for name in targets
        }
        for name, rounds in by_target.items():
            cpu = [r.cpu_us_per_request or 0.0 for r in rounds]
            lines.append(
                f"| {concurrency} | {name} "
                f"| {statistics.median(r.throughput for r in rounds):.1f} "
                f"| {statistics.median(r.percentile(0.5) for r in rounds):.2f} "
                f"| {statistics.median(r.percentile(0.99) for r in rounds):.2f} "
                f"| {statistics.median(cpu):.0f} |"
            )
        for name in targets[1:]:
            counted = [samples[(name, concurrency, run)] for run in range(args.runs)]
            verdicts.append(_verdict(name, by_target[OFF], by_target[name], counted))
    return "\n".join([*lines, "", *verdicts])


def _stop_on_sigterm(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def start_targets(
    children: ChildProcesses, workdir: Path, args: argparse.Namespace
) -> list[Server]:
    """The fake upstream and a gateway per target, each with its scenario's head; on
    the shadowed ones an evaluating candidate, already picked up by the shadow arm."""
    upstream = start_upstream(children)
    servers = []
    for fraction in (None, *args.fractions):
        name = OFF if fraction is None else shadowed(fraction)
        (workdir / name).mkdir()
        server, database = start_reef(
            children, upstream.base_url, workdir / name, name, args.durability
        )
        first_request(server)
        if fraction is not None:
            config = ShadowConfig(
                fraction=fraction, max_requests=10**9, concurrency=args.shadow_concurrency
            )
            make_evaluating(database, config)
            wait_shadowing(server)
        servers.append(server)
    return servers


def main(argv: list[str]) -> int:
    """Start the servers, measure, report; stop the servers."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="reef-shadow-") as tmp:
        children = ChildProcesses(Path(tmp))
        try:
            servers = start_targets(children, Path(tmp), args)
            results, samples = asyncio.run(measure(servers, args))
        except StartError as exc:
            print(f"could not start a server: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted: every server stopped", file=sys.stderr)
            return 130
        finally:
            children.stop_all()
    text = report(args, argv, results, samples, (load_before, os.getloadavg()[0]))
    print(text)
    if args.output is not None:
        write_between(args.output, START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

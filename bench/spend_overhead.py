"""Budgets and rate limits' cost: Reef's gateway at concurrency 1 and 32 with prices,
budgets and rate limits on and off, side by side in one run.

    .venv/bin/python bench/spend_overhead.py --requests 2000 --runs 3 --output docs/benchmarks.md

One run starts, as separate processes on loopback: the fake upstream
(``tests.fakes.upstream``) and two ``reef serve`` (capture on, ``sync`` durability,
SQLite each): *reef-spend-off* with no price, budget or limit, and *reef-spend-on* with
a price for the model, a global and a scenario budget (hour, day and month windows,
``budgets.ledger: memory``, the default on SQLite) and a scenario rate limit (requests
and tokens per minute), all set far above what the load spends so nothing is refused.
The same non-streaming chat requests (``bench/load.py``) go to both after a warm-up,
rounds alternating; the report gives the added p50 at concurrency 1 and the throughput
ratio on/off at 32 (medians over rounds; issue 42's targets: +0.1 ms, 0.95x).

``--path-only`` measures, in this process and without servers, what the spend path adds
to one request: the calls the gateway makes per request (the price, the reservation on
the budgets and buckets, the usage counted and settled, the record's cost and price),
with the same two configurations. CPU µs per request (the best of ``--runs`` runs of
``--requests``); with ``--instructions``, the instructions per request counted by
``valgrind --tool=callgrind`` (only inside the measured loop: repeatable under load).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn

from contenders import (
    SPEND_CONFIG,
    SPEND_PRICES,
    ChildProcesses,
    Server,
    StartError,
    child_env,
    free_port,
    start_upstream,
    wait_ready,
)
from gateway_overhead import process_cpu_seconds
from load import CHAT_BODY, MODEL, LoadResult, client_session, drive, sdk_headers
from sections import write_between

START, END = "<!-- spend_overhead:start -->", "<!-- spend_overhead:end -->"
TARGETS = ("reef-spend-off", "reef-spend-on")
_LOOPBACK = "127.0.0.1"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000, help="measured per round")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured, before each round")
    parser.add_argument("--concurrency", default="1,32", help="comma-separated levels")
    parser.add_argument("--runs", type=int, default=3, help="rounds per target, alternating")
    parser.add_argument("--note", default="", help="a line about the machine, for the report")
    parser.add_argument("--output", type=Path, help="markdown file whose section to rewrite")
    parser.add_argument(
        "--path-only", action="store_true", help="the spend path in-process, per request"
    )
    parser.add_argument(
        "--instructions", action="store_true", help="with --path-only: count with callgrind"
    )
    parser.add_argument("--path-side", choices=("off", "on"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.concurrency = sorted({int(level) for level in args.concurrency.split(",")})
    if min(args.requests, args.runs, args.concurrency[0]) < 1:
        parser.error("--requests, --runs and every concurrency must be at least 1")
    return args


def write_config(home: Path, port: int, upstream: str, spend: bool) -> Path:
    """``home``'s ``reef.yaml``: capture on (``sync``), with prices, budgets and limits
    if ``spend``."""
    home.mkdir()
    prices = f", prices: {{{MODEL}: {SPEND_PRICES}}}" if spend else ""
    config = home / "reef.yaml"
    config.write_text(
        f"home: {home / 'home'}\n"
        f"server: {{port: {port}}}\n"
        f'store: {{url: "sqlite:///{home / "reef.db"}", durability: sync}}\n'
        f"upstreams: {{fake: {{type: openai, base_url: {upstream!r}{prices}}}}}\n"
        + (SPEND_CONFIG if spend else "")
    )
    return config


def start_gateway(
    children: ChildProcesses, name: str, upstream: str, workdir: Path, spend: bool
) -> Server:
    """``reef serve`` with capture on (``sync``), with prices, budgets and limits if
    ``spend``."""
    port = free_port()
    home = workdir / name
    config = write_config(home, port, upstream, spend)
    argv = [sys.executable, "-m", "reef", "serve", "-c", str(config), "--log-level", "WARNING"]
    argv += ["--no-worker"]
    process, log = children.spawn(name, argv, child_env())
    wait_ready(process, log, f"http://{_LOOPBACK}:{port}/healthz", 60)
    return Server(name, f"http://{_LOOPBACK}:{port}/v1", process, log)


async def measure(servers: list[Server], args: argparse.Namespace) -> list[LoadResult]:
    """Per concurrency and run: warm-up then a measured round per target, alternating."""
    results: list[LoadResult] = []
    headers = sdk_headers("sk-bench")
    limit = 60.0 + 0.1 * (args.requests + args.warmup)
    for concurrency in args.concurrency:
        async with client_session(concurrency) as session:
            for run in range(args.runs):
                order = servers if run % 2 == 0 else servers[::-1]
                for server in order:
                    for count in (args.warmup, args.requests):
                        cpu_before = process_cpu_seconds(server.process.pid)
                        result = await drive(
                            session, server.name, server.chat_url, headers, concurrency,
                            count, limit,
                        )  # fmt: skip
                        result.cpu_seconds = process_cpu_seconds(server.process.pid) - cpu_before
                    results.append(result)
                    print(
                        f"c={concurrency} run {run + 1} {server.name:14} "
                        f"{result.throughput:8.1f} req/s  p50 {result.percentile(0.5):6.2f} ms",
                        flush=True,
                    )
    return results


def report(
    args: argparse.Namespace,
    argv: list[str],
    results: list[LoadResult],
    load: tuple[float, float],
) -> str:
    """The markdown section: per concurrency and target, the medians; the two figures."""
    lines = [
        "## Budgets and rate limits: the gateway with them on vs off",
        "",
        f"`{shlex.join(['python', 'bench/spend_overhead.py', *argv])}`",
        "",
        f"{args.requests} measured non-streaming chat requests per round after "
        f"{args.warmup} warm-up, {args.runs} round(s) per target and concurrency, "
        f"alternating; medians over rounds. Load average before/after: {load[0]:.2f} / "
        f"{load[1]:.2f}. " + (args.note or ""),
        "",
        "| concurrency | target | req/s | p50 ms | p99 ms | CPU µs/req |",
        "|---|---|---|---|---|---|",
    ]
    verdicts = []
    for concurrency in args.concurrency:
        by_target = {
            name: [r for r in results if r.target == name and r.concurrency == concurrency]
            for name in TARGETS
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
        off, on = by_target["reef-spend-off"], by_target["reef-spend-on"]
        deltas = [b.percentile(0.5) - a.percentile(0.5) for a, b in zip(off, on, strict=True)]
        ratios = [b.throughput / a.throughput for a, b in zip(off, on, strict=True)]
        verdicts.append(
            f"c={concurrency}: p50 on-off **{statistics.median(deltas):+.3f} ms** (per round: "
            f"{', '.join(f'{d:+.3f}' for d in deltas)}); throughput on/off "
            f"**{statistics.median(ratios):.3f}x** (per round: "
            f"{', '.join(f'{r:.3f}' for r in ratios)})."
        )
    return "\n".join([*lines, "", *verdicts])


_USAGE = {"prompt_tokens": 26, "completion_tokens": 9, "total_tokens": 35}  # the fake's


def path_step(spend: bool, workdir: Path) -> Callable[[int], None]:
    """One request's spend path as the gateway runs it, with the configuration of
    *reef-spend-on* (``spend``) or *reef-spend-off*, on a fresh ``SpendControl``."""
    import orjson

    from reef.config import load_settings
    from reef.core.clock import utc_now
    from reef.core.prices import usage_tokens
    from reef.experience import MemoryLedger
    from reef.gateway.budgets import SpendControl, request_estimate

    home = workdir / ("on" if spend else "off")
    settings = load_settings(write_config(home, 1, "http://127.0.0.1:9/v1", spend))
    control = SpendControl(settings, MemoryLedger(), utc_now)
    default_max_tokens = settings.budgets.default_max_tokens

    async def request(index: int) -> None:
        body = CHAT_BODY % index
        fields = orjson.loads(body)
        # InferenceRoutes._admit
        price = control.price_for("default", None, fields["model"], True)
        charge = None
        if control.enabled:  # the estimate: (input, output) tokens
            estimate = request_estimate(body, fields, default_max_tokens)
            charge = await control.admit("default", None, estimate, price)
        # InferenceRoutes._used
        tokens = usage_tokens(_USAGE)
        cost = price.cost(tokens) if price and tokens else None
        control.count("default", "serve", tokens, cost)
        if charge is not None and tokens is not None:
            await charge.settle(tokens, cost if charge.price is price else None)
        # Recorder.draft: the record's cost (the one counted) and price
        if cost is not None and price is not None:
            price.as_dict()

    def step(index: int) -> None:
        run_to_end(request(index))

    return step


def run_to_end(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run ``coroutine``, which must not suspend (the in-memory spend path never does)."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("the spend path suspended: it waited on something")


def path_cpu(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    """CPU µs per request of each side: the best of ``--runs`` runs, sides alternating."""
    steps = {side: path_step(side == "on", workdir) for side in ("off", "on")}
    best = dict.fromkeys(steps, float("inf"))
    for step in steps.values():
        for index in range(args.warmup):
            step(index)
    for _ in range(args.runs):
        for side, step in steps.items():
            started = time.process_time()
            for index in range(args.requests):
                step(index)
            elapsed = time.process_time() - started
            best[side] = min(best[side], elapsed / args.requests * 1e6)
    return best


def path_side(args: argparse.Namespace) -> int:
    """Under callgrind (``--toggle-collect=functools_reduce``): warm up uninstrumented,
    switch instrumentation on, then run ``--requests`` inside ``functools.reduce`` (the
    one place instructions are collected)."""
    with tempfile.TemporaryDirectory(prefix="reef-spend-path-") as tmp:
        step = path_step(args.path_side == "on", Path(tmp))
        for index in range(args.warmup):
            step(index)
        control = subprocess.Popen(
            ["callgrind_control", "--instr=on", str(os.getpid())], stdout=subprocess.DEVNULL
        )
        while control.poll() is None:  # keep running: valgrind takes commands as it runs
            time.sleep(0.001)
        functools.reduce(lambda _, index: step(index), range(args.requests), None)
    return 0


def path_instructions(args: argparse.Namespace, argv: list[str]) -> dict[str, float]:
    """Instructions per request of each side, each in its own callgrind run."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    counts = {}
    with tempfile.TemporaryDirectory(prefix="reef-spend-cg-") as tmp:
        for side in ("off", "on"):
            out = Path(tmp) / f"{side}.out"
            command = [
                valgrind, "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                "--toggle-collect=functools_reduce", f"--callgrind-out-file={out}",
                sys.executable, __file__, "--path-side", side,
                "--requests", str(args.requests), "--warmup", str(args.warmup),
            ]  # fmt: skip
            env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict probes every run
            done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
            found = re.search(r"^totals: (\d+)", out.read_text() if out.exists() else "", re.M)
            if done.returncode != 0 or found is None:
                raise SystemExit(f"callgrind run failed:\n{done.stderr[-2000:]}")
            counts[side] = int(found.group(1)) / args.requests
    return counts


def path_report(args: argparse.Namespace, argv: list[str]) -> str:
    """``--path-only``: CPU (and instructions) per request of the spend path, on vs off."""
    with tempfile.TemporaryDirectory(prefix="reef-spend-path-") as tmp:
        cpu = path_cpu(args, Path(tmp))
    lines = [
        f"`{shlex.join(['python', 'bench/spend_overhead.py', *argv])}`",
        "",
        f"The spend path per request, in-process ({args.requests} requests per run, best "
        f"of {args.runs}): CPU off {cpu['off']:.2f} µs, on {cpu['on']:.2f} µs, "
        f"**added {cpu['on'] - cpu['off']:.2f} µs**.",
    ]
    if args.instructions:
        counts = path_instructions(args, argv)
        lines.append(
            f"Instructions per request (callgrind): off {counts['off']:.0f}, on "
            f"{counts['on']:.0f}, **added {counts['on'] - counts['off']:.0f}**."
        )
    return "\n".join(lines)


def _stop_on_sigterm(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    """Start the servers, measure, report; stop the servers."""
    args = parse_args(argv)
    if args.path_side is not None:
        return path_side(args)
    if args.path_only:
        print(path_report(args, argv))
        return 0
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="reef-spend-") as tmp:
        children = ChildProcesses(Path(tmp))
        try:
            upstream = start_upstream(children)
            servers = [
                start_gateway(children, "reef-spend-off", upstream.base_url, Path(tmp), False),
                start_gateway(children, "reef-spend-on", upstream.base_url, Path(tmp), True),
            ]
            results = asyncio.run(measure(servers, args))
        except StartError as exc:
            print(f"could not start a server: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted: every server stopped", file=sys.stderr)
            return 130
        finally:
            children.stop_all()
    text = report(args, argv, results, (load_before, os.getloadavg()[0]))
    print(text)
    if args.output is not None:
        write_between(args.output, START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Gateway overhead: what Reef's recording gateway adds to a chat call, next to a bare
passthrough proxy and the LiteLLM proxy, all in front of the same fake upstream; and what
the same call costs through Reef as an OpenAI Responses request.

    .venv/bin/python bench/gateway_overhead.py --requests 2000 --concurrency 1,32 --runs 3 \
        --output docs/benchmarks.md

One run starts, as separate processes on loopback: the fake upstream
(``tests.fakes.upstream``), ``bench/passthrough.py``, ``reef serve`` (capture on,
``sync`` durability, SQLite in a temporary directory or ``--store postgres``) and the
LiteLLM proxy (its own venv, ``bench/.venv-litellm``, made on first use;
``--skip-litellm`` leaves it out).
The same non-streaming chat requests go to each at every concurrency, after a warm-up;
the *reef-responses* target sends that request as ``POST /v1/responses`` to the same
Reef (translated onto the fake's chat completions, the response kept for
``previous_response_id``). ``--runs`` repeats the rounds (target order rotated) to show
the spread. Afterwards the Reef records in its store are counted against the requests
sent through Reef (both targets).

``--store postgres`` puts Reef's records in PostgreSQL instead of SQLite: a database of
the bench's own, ``reef_bench``, made anew on the server of ``--postgres-url`` (default:
``$REEF_TEST_POSTGRES_URL``) for each ``--workers`` count and dropped afterwards; the
database that URL names is never touched. When the server runs on this machine (its
data directory readable, as root), the CPU of its processes during Reef's rounds is
reported per Reef request too: the table's CPU column counts Reef's processes only, and
the server shares their cores. The report names the store. ``--spend`` takes SQLite
only.

``--spend`` adds *reef-spend-on*: a second ``reef serve`` like *reef* but with a price for
the model, budgets and rate limits (``contenders.SPEND_CONFIG``, far above what the load
spends), measured in the same rotation; the report gives its added p50 at the lowest
concurrency and its throughput at the highest against *reef* (issue 42's targets: +0.1
ms, 0.95x).

``--capture-off`` adds *reef-capture-off*: a second ``reef serve`` like *reef* whose
scenario records nothing (``capture: false``), measured in the same rotation; the report
splits Reef's CPU per request and its p99 at the highest concurrency into what capture
(building the record, the ``sync`` commit, the WAL checkpoints) costs and what the rest
of the gateway does.

``--workers 1,2`` repeats the whole benchmark once per count, with fresh servers: Reef
as ``reef serve --workers N`` and the passthrough as N processes on its port
(``SO_REUSEPORT``), so both get the same cores; CPU is summed over each server's
processes. ``--output`` takes one count.

The load generator (``--loader``) is ``wrk`` when it is on PATH (``apt-get install
wrk``), else Python's (``load.py``); the report says which. Why wrk: the Python loader
runs in this process and eats most of a core (aiohttp), so on a 2-core machine a second
gateway worker had no CPU to use: 3,998 req/s with one Reef process, 3,314 with two
(passthrough 5,639 / 5,692), while the gateway costs ~255 µs of CPU per request, the
fake upstream ~55 µs and wrk ~10-20 µs. With wrk (``wrk_load.py``) a round is timed:
``--seconds`` long, or as long as ``--requests`` take at the warm-up's pace; its Lua
script sends the same bodies and headers, and counts the requests it sent, the 2xx
answers and the receipts (keeping a sample), so the record check still compares every
request sent through Reef (warm-ups included) with the records; its latency histogram
gives the same table (wrk's coordinated-omission additions taken out).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import secrets
import shlex
import signal
import sqlite3
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import overhead_report
from contenders import (
    ChildProcesses,
    Server,
    StartError,
    start_litellm,
    start_passthrough,
    start_reef,
    start_upstream,
)
from load import (
    CHAT_BODY,
    MAX_ERRORS,
    RESPONSES_BODY,
    LoadResult,
    TooManyErrorsError,
    client_session,
    drive,
    sdk_headers,
)
from wrk_load import drive_wrk, warmup_seconds, wrk_path

RESPONSES_TARGET = "reef-responses"
SPEND_TARGET = "reef-spend-on"
CAPTURE_OFF_TARGET = "reef-capture-off"
POSTGRES_ENV = "REEF_TEST_POSTGRES_URL"
BENCH_DATABASE = "reef_bench"  # --store postgres: dropped and made anew for each count


@dataclass
class Measurements:
    """Every measured round, plus what is needed to check Reef's records."""

    results: list[LoadResult] = field(default_factory=list)
    reef_requests: int = 0  # sent through Reef, warm-ups included
    reef_receipts: list[str] = field(default_factory=list)  # with wrk, a sample
    reef_receipt_count: int = 0  # receipts returned
    failed: dict[str, str] = field(default_factory=dict)  # target -> why it was dropped


@dataclass(frozen=True)
class Target:
    """Where one target's requests go, and which request."""

    name: str
    url: str
    body: bytes
    pid: int  # the process that serves it (direct: the fake upstream)
    store_pid: int | None = None  # Reef on a local PostgreSQL: its postmaster


def store_cpu_seconds(target: Target) -> float | None:
    """CPU of the store server's processes so far (postmaster, backends, WAL writer...);
    ``None`` when the target's store is not a local PostgreSQL."""
    return None if target.store_pid is None else tree_cpu_seconds(target.store_pid)


def postmaster_pid(store_url: str) -> int | None:
    """The PostgreSQL server's postmaster process, when it runs on this machine and its
    data directory can be read (its CPU per Reef request goes in the report)."""
    import psycopg

    with psycopg.connect(store_url) as pg:
        row = pg.execute("SELECT setting FROM pg_settings WHERE name = 'data_directory'")
        (data_directory,) = row.fetchone() or ("",)
    try:
        pid = int((Path(data_directory) / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU of process ``pid`` and of its live children (a server's worker processes)."""
    total = process_cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                total += process_cpu_seconds(int(child))
            except FileNotFoundError:
                continue  # ended since it was listed
    return total


def targets_of(servers: list[Server], store_pid: int | None = None) -> list[Target]:
    """Every server's chat completions; Reef's Responses route right after Reef's.
    ``store_pid``: Reef's PostgreSQL server's postmaster, when it is local."""
    targets = []
    for server in servers:
        pid = server.process.pid
        if server.name == "reef":
            targets.append(Target(server.name, server.chat_url, CHAT_BODY, pid, store_pid))
            url = server.base_url + "/responses"
            targets.append(Target(RESPONSES_TARGET, url, RESPONSES_BODY, pid, store_pid))
        else:
            targets.append(Target(server.name, server.chat_url, CHAT_BODY, pid))
    return targets


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000, help="measured per round")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured, before each round")
    parser.add_argument("--concurrency", default="1,32", help="comma-separated levels")
    parser.add_argument("--runs", type=int, default=1, help="repeat all rounds this often")
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument(
        "--spend", action="store_true", help="also Reef with prices, budgets and rate limits"
    )
    parser.add_argument(
        "--capture-off", action="store_true", help="also Reef recording nothing, to split its cost"
    )
    parser.add_argument("--output", type=Path, help="markdown file whose section to rewrite")
    parser.add_argument(
        "--workers", default="1", help="comma-separated process counts for Reef and passthrough"
    )
    parser.add_argument(
        "--loader",
        choices=("python", "wrk"),
        default="wrk" if wrk_path() else "python",
        help="load generator (default: wrk when on PATH)",
    )
    parser.add_argument(
        "--seconds", type=float, help="wrk: measured round length (default: ~--requests long)"
    )
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk: threads per round")
    parser.add_argument(
        "--store", choices=("sqlite", "postgres"), default="sqlite", help="where Reef records"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(POSTGRES_ENV),
        help=f"--store postgres: a server to make the {BENCH_DATABASE} database on "
        f"(default: ${POSTGRES_ENV}); its own database is never touched",
    )
    args = parser.parse_args(argv)
    args.concurrency = sorted({int(level) for level in args.concurrency.split(",")})
    args.workers = sorted({int(count) for count in args.workers.split(",")})
    if args.requests < 1 or args.runs < 1 or args.concurrency[0] < 1 or args.workers[0] < 1:
        parser.error("--requests, --runs, every concurrency and --workers must be at least 1")
    if args.loader == "wrk" and wrk_path() is None:
        parser.error("--loader wrk: wrk is not on PATH (apt-get install wrk)")
    if (args.seconds is not None and args.seconds <= 0) or args.wrk_threads < 1:
        parser.error("--seconds must be positive and --wrk-threads at least 1")
    if args.output is not None and len(args.workers) > 1:
        parser.error("--output takes one --workers count")
    if args.store == "postgres":
        if not args.postgres_url:
            parser.error(f"--store postgres needs --postgres-url or ${POSTGRES_ENV}")
        if args.spend:
            parser.error("--spend runs on --store sqlite only")
    return args


def _postgres_url(server_url: str, database: str) -> str:
    """``server_url`` (any ``postgresql`` URL) naming ``database`` instead, for psycopg."""
    from sqlalchemy.engine import make_url

    url = make_url(server_url).set(drivername="postgresql", database=database)
    return url.render_as_string(hide_password=False)


def _on_maintenance_database(server_url: str, statement: str) -> None:
    """Run ``statement`` (``CREATE``/``DROP DATABASE``) on the server's ``postgres``
    database, outside a transaction."""
    import psycopg

    with psycopg.connect(_postgres_url(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(statement)


def fresh_bench_database(server_url: str) -> str:
    """Drop ``BENCH_DATABASE`` if a run left it, create it empty; its URL."""
    drop_bench_database(server_url)
    _on_maintenance_database(server_url, f'CREATE DATABASE "{BENCH_DATABASE}"')
    return _postgres_url(server_url, BENCH_DATABASE)


def drop_bench_database(server_url: str) -> None:
    """Drop ``BENCH_DATABASE`` (and whatever is still connected to it)."""
    _on_maintenance_database(server_url, f'DROP DATABASE IF EXISTS "{BENCH_DATABASE}" WITH (FORCE)')


def store_url_of(args: argparse.Namespace, workdir: Path) -> str:
    """Reef's ``store.url``: SQLite in ``workdir``, or a fresh ``BENCH_DATABASE``."""
    if args.store == "postgres":
        return fresh_bench_database(args.postgres_url)
    return f"sqlite:///{workdir / 'reef.db'}"


def store_name(args: argparse.Namespace) -> str:
    """The store, as the report names it."""
    return "PostgreSQL" if args.store == "postgres" else "SQLite"


def start_servers(
    children: ChildProcesses,
    workdir: Path,
    args: argparse.Namespace,
    master_key: str,
    workers: int,
    store_url: str,
) -> tuple[list[Server], str | None]:
    """All contenders (Reef recording to ``store_url``) and why LiteLLM is absent (or
    ``None``)."""
    skip_litellm = args.skip_litellm
    upstream = start_upstream(children)
    print(f"fake upstream   {upstream.base_url}", flush=True)
    passthrough = start_passthrough(children, upstream.base_url, workers)
    print(f"passthrough     {passthrough.base_url}  ({workers} processes)", flush=True)
    reef, _ = start_reef(children, upstream.base_url, workdir, workers=workers, store_url=store_url)
    shown = store_url.split("@")[-1]  # no credentials in the output
    print(
        f"reef            {reef.base_url}  (sync capture to {shown}, {workers} workers)",
        flush=True,
    )
    servers = [upstream, passthrough, reef]
    if args.spend:
        spend_dir = workdir / "spend"
        spend_dir.mkdir()
        spent, _ = start_reef(
            children, upstream.base_url, spend_dir, SPEND_TARGET, workers=workers, spend=True
        )
        print(f"reef-spend-on   {spent.base_url}  (prices, budgets, rate limits)", flush=True)
        servers.append(spent)
    if args.capture_off:
        off_dir = workdir / "capture-off"
        off_dir.mkdir()
        off, _ = start_reef(
            children, upstream.base_url, off_dir, CAPTURE_OFF_TARGET, workers=workers,
            capture=False,
        )  # fmt: skip
        print(f"reef-capture-off {off.base_url}  (records nothing)", flush=True)
        servers.append(off)
    if skip_litellm:
        return servers, "skipped (--skip-litellm)"
    try:
        litellm = start_litellm(children, upstream.base_url, workdir, master_key)
    except (StartError, OSError, TimeoutError) as exc:
        print(f"LiteLLM left out: {exc}", flush=True)
        return servers, f"could not be installed or started: {exc}"
    print(f"litellm         {litellm.base_url}", flush=True)
    return [*servers, litellm], None


async def measure(
    servers: list[Server], args: argparse.Namespace, key: str, store_pid: int | None = None
) -> Measurements:
    """Warm-up then measured round, per run, concurrency and target."""
    # The load generator's own full garbage collections (one of 78 ms measured mid-round
    # on a loaded machine) land in the latencies of whichever target is being measured:
    # hide what is alive now from them, as the gateway does at start-up.
    gc.collect()
    gc.freeze()
    done = Measurements()
    headers = sdk_headers(key)
    limit = 60.0 + 0.1 * (args.requests + args.warmup)
    targets = targets_of(servers, store_pid)
    async with client_session(args.concurrency[-1]) as session:
        for run in range(args.runs):
            for level in args.concurrency:
                order = targets[run % len(targets) :] + targets[: run % len(targets)]
                for target in order:
                    if target.name in done.failed:
                        continue
                    try:
                        if args.loader == "wrk":
                            result = await _wrk_rounds(target, level, headers, args, done)
                        else:
                            for count in (args.warmup, args.requests):
                                cpu_before = tree_cpu_seconds(target.pid)
                                store_before = store_cpu_seconds(target)
                                result = await drive(
                                    session,
                                    target.name,
                                    target.url,
                                    headers,
                                    level,
                                    count,
                                    limit,
                                    target.body,
                                )
                                result.cpu_seconds = tree_cpu_seconds(target.pid) - cpu_before
                                _store_cpu(result, target, store_before)
                                _count_reef(done, target, result, count)
                    except (RuntimeError, ValueError, TimeoutError) as exc:  # wrk's too
                        if target.name == "direct":
                            raise
                        done.failed[target.name] = f"{type(exc).__name__}: {exc}"
                        print(f"{target.name} dropped: {done.failed[target.name]}", flush=True)
                        continue
                    done.results.append(result)
                    print(overhead_report.progress_line(run, result), flush=True)
    return done


def _store_cpu(result: LoadResult, target: Target, before: float | None) -> None:
    """Set the round's store server CPU, counted from ``before`` (when it is known)."""
    after = store_cpu_seconds(target)
    if before is not None and after is not None:
        result.store_cpu_seconds = after - before


def _count_reef(done: Measurements, target: Target, result: LoadResult, sent: int) -> None:
    """Add a round's ``sent`` requests and its receipts to Reef's tally (other targets:
    nothing)."""
    if target.name not in ("reef", RESPONSES_TARGET):
        return
    done.reef_requests += sent
    done.reef_receipts += result.receipts
    done.reef_receipt_count += result.receipt_count


async def _wrk_rounds(
    target: Target,
    level: int,
    headers: dict[str, str],
    args: argparse.Namespace,
    done: Measurements,
) -> LoadResult:
    """A timed warm-up then the measured round, each one wrk run. Without ``--seconds``
    the warm-up lasts ``--warmup`` ms and the measured round what ``--requests`` would
    take at the warm-up's pace (1 to 120 s); with it, the warm-up is that share of it."""
    pace = 1000.0  # req/s, when there is no warm-up to take it from
    warmup = warmup_seconds(args.warmup, args.requests, args.seconds)
    rounds = ([warmup] if warmup else []) + [None]
    for seconds in rounds:
        if seconds is None:
            seconds = args.seconds or min(120.0, max(1.0, args.requests / pace))
        cpu_before = tree_cpu_seconds(target.pid)
        store_before = store_cpu_seconds(target)
        result = await drive_wrk(
            target.url, headers, level, seconds, target.body, target.name, args.wrk_threads
        )
        result.cpu_seconds = tree_cpu_seconds(target.pid) - cpu_before
        _store_cpu(result, target, store_before)
        _count_reef(done, target, result, result.requests_sent or 0)
        if len(result.errors) > MAX_ERRORS:
            raise TooManyErrorsError(f"{target.name}: {result.errors[-1]}")
        pace = result.throughput or pace
    return result


def check_records(store_url: str, measured: Measurements) -> overhead_report.RecordCheck:
    """Count Reef's records (read-only, the gateway still running) and look up receipts,
    in SQLite or PostgreSQL."""
    sample = measured.reef_receipts[:: max(1, len(measured.reef_receipts) // 100)][:100]
    if store_url.startswith("sqlite:///"):
        database = store_url.removeprefix("sqlite:///")
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
            (count,) = connection.execute("SELECT COUNT(*) FROM records").fetchone()
            marks = ",".join("?" * len(sample))
            query = f"SELECT COUNT(*) FROM records WHERE id IN ({marks})"
            (found,) = connection.execute(query, sample).fetchone() if sample else (0,)
    else:
        import psycopg

        with psycopg.connect(store_url) as pg, pg.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM records")
            (count,) = cursor.fetchone() or (0,)
            cursor.execute("SELECT COUNT(*) FROM records WHERE id = ANY(%s)", (sample,))
            (found,) = cursor.fetchone() or (0,)
    return overhead_report.RecordCheck(
        sent=measured.reef_requests,
        receipts=measured.reef_receipt_count,
        records=int(count),
        sampled=len(sample),
        sample_found=int(found),
    )


def _stop_on_sigterm(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def run_event_loop(
    servers: list[Server], args: argparse.Namespace, key: str, store_pid: int | None = None
) -> Measurements:
    try:
        import uvloop

        return uvloop.run(measure(servers, args, key, store_pid))
    except ImportError:
        return asyncio.run(measure(servers, args, key, store_pid))


def main(argv: list[str]) -> int:
    try:
        return benchmark(parse_args(argv), argv)
    except KeyboardInterrupt:
        print("interrupted: every server stopped", file=sys.stderr)
        return 130


def benchmark(args: argparse.Namespace, argv: list[str]) -> int:
    """Once per ``--workers`` count: start the servers, measure, check Reef's records,
    report, stop the servers. 0 when every count passed."""
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    worst = 0
    for workers in args.workers:
        print(f"== {workers} worker{'s' if workers > 1 else ''} ==", flush=True)
        worst = max(worst, _benchmark_once(args, argv, workers))
    return worst


def _benchmark_once(args: argparse.Namespace, argv: list[str], workers: int) -> int:
    load_before = os.getloadavg()
    key = "sk-bench-" + secrets.token_hex(16)  # LiteLLM's master key; others ignore it
    with tempfile.TemporaryDirectory(prefix="reef-overhead-") as tmp:
        children = ChildProcesses(Path(tmp))
        try:
            store_url = store_url_of(args, Path(tmp))
            servers, litellm_note = start_servers(
                children, Path(tmp), args, key, workers, store_url
            )
            store_pid = postmaster_pid(store_url) if args.store == "postgres" else None
            measured = run_event_loop(servers, args, key, store_pid)
            records = check_records(store_url, measured)
        except StartError as exc:
            print(f"could not start a server: {exc}", file=sys.stderr)
            return 2
        finally:
            children.stop_all()
            if args.store == "postgres":
                drop_bench_database(args.postgres_url)
    if litellm_note is None and "litellm" in measured.failed:
        litellm_note = f"failed during the load: {measured.failed['litellm']}"
    report = overhead_report.Report(
        command=shlex.join(["python", "bench/gateway_overhead.py", *argv]),
        args=args,
        results=measured.results,
        records=records,
        litellm_note=litellm_note,
        failed=measured.failed,
        load_before=load_before,
        load_after=os.getloadavg(),
        store=store_name(args),
    )
    print(report.text())
    if args.output is not None:
        overhead_report.write_section(args.output, report.markdown())
        print(f"wrote {args.output}")
    reef_failed = {"reef", RESPONSES_TARGET} & set(measured.failed)
    return 0 if records.ok and not reef_failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

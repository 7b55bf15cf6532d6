"""Fault matrix: what a client sees when its upstream fails, what Reef records, and that
the gateway stays up; then SIGKILL under 500 concurrent streams.

    .venv/bin/python bench/faults.py --output docs/benchmarks.md

A real ``reef serve`` (capture on, ``sync`` durability, SQLite in a temporary directory)
runs in front of the fake model server (``tests.fakes.upstream``, in this process),
which misbehaves on request: each fault is a token in the user's message. Connection
refused is a port nobody listens on; a connect timeout is a socket whose accept queue
is full. Every fault goes through the official ``openai`` and ``anthropic`` SDKs (no SDK
retries), streaming and not: an OpenAI client on an OpenAI-compatible upstream, an
Anthropic client on an Anthropic one, and an Anthropic client on the OpenAI-compatible
upstream (``translated``). Each cell checks: the status and the error in the
client's dialect (or the retried answer), the upstream attempts, the record's status
and error reason, and that ``/healthz`` and a normal request still answer afterwards.
A cell that is not as expected makes the exit status 1.

Then ``--crash-streams`` clients (half OpenAI, half Anthropic) stream through a second
gateway until ``--kill-after`` streams have ended, and the gateway is SIGKILLed: every
receipt of a stream whose client saw its proper end (``[DONE]``, ``message_stop``) must
be in the store, and the database must pass SQLite's integrity check.

``--faults`` and ``--dialects`` pick a reduced matrix, ``--crash-streams 0`` skips the
crash; ``--output`` rewrites the ``faults`` section of that markdown file.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.fakes

import anthropic
import openai
from contenders import ChildProcesses, StartError, child_env, free_port, wait_ready
from fault_cells import DIALECTS, FAULTS, Cell, Gateway, Outcome, faults, run_cell
from fault_crash import CrashResult, crash_under_streams
from overhead_report import machine
from sections import write_between
from tests.fakes.upstream import FakeUpstreamThread

from reef.experience import open_store

_SDK = {"openai": "openai", "anthropic": "anthropic", "translated": "anthropic"}
START = "<!-- faults:start -->"
END = "<!-- faults:end -->"
TIMEOUTS = {
    "connect_timeout_seconds": 0.5,
    "read_timeout_seconds": 1.0,
    "total_timeout_seconds": 15.0,
    "max_retries": 2,
}
# Past the default 64 MiB, so that the huge answer (100 MB) is relayed and measured.
MAX_RESPONSE_BYTES = 256 * 1024 * 1024


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--faults", help="comma-separated fault names (default: all)")
    parser.add_argument("--dialects", default=",".join(DIALECTS), help="of " + ",".join(DIALECTS))
    parser.add_argument("--huge-mb", type=int, default=100, help="size of the huge answer")
    parser.add_argument("--crash-streams", type=int, default=500, help="0 skips the crash")
    parser.add_argument("--kill-after", type=int, default=1000, help="streams ended first")
    parser.add_argument("--output", type=Path, help="markdown file whose section to rewrite")
    args = parser.parse_args(argv)
    names = [fault.name for fault in FAULTS]
    args.fault_names = args.faults.split(",") if args.faults else names
    unknown = sorted(set(args.fault_names) - set(names))
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(names)}")
    args.dialect_names = args.dialects.split(",")
    if not set(args.dialect_names) <= set(DIALECTS):
        parser.error(f"--dialects takes {', '.join(DIALECTS)}")
    return args


@contextmanager
def full_accept_queue() -> Iterator[int]:
    """A loopback port whose accept queue is full, so that connecting to it times out."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = int(server.getsockname()[1])
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    try:
        yield port
    finally:
        for filler in fillers:
            filler.close()
        server.close()


def gateway_config(workdir: Path, upstreams: dict[str, str]) -> tuple[Path, int, Path]:
    """A reef.yaml with an OpenAI and an Anthropic upstream per base URL in
    ``upstreams`` (``kind -> base URL``), and scenarios ``openai-<kind>``,
    ``anthropic-<kind>`` and ``translated-<kind>`` (Anthropic clients on the OpenAI
    upstream). Returns the file, the port and the SQLite path."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    database = workdir / "reef.db"
    lines = [
        f"home: {workdir / 'home'}",
        f"server: {{port: {port}}}",
        f'store: {{url: "sqlite:///{database}", durability: sync}}',
        "upstreams:",
    ]
    settings = {**TIMEOUTS, "max_response_bytes": MAX_RESPONSE_BYTES}
    timeouts = ", ".join(f"{key}: {value}" for key, value in settings.items())
    scenarios = ["scenarios:"]
    for kind, base_url in upstreams.items():
        for dialect, model in (("openai", "fake-model"), ("anthropic", "fake-claude")):
            name = f"{dialect}-{kind}"
            lines.append(
                f"  {name}: {{type: {dialect}, base_url: {base_url!r}, model: {model}, {timeouts}}}"
            )
            scenarios.append(f"  {name}: {{upstream: {name}}}")
        scenarios.append(f"  translated-{kind}: {{upstream: openai-{kind}}}")
    config = workdir / f"reef-{port}.yaml"
    config.write_text("\n".join([*lines, *scenarios]) + "\n")
    return config, port, database


def start_gateway(children: ChildProcesses, workdir: Path, upstreams: dict[str, str]) -> Gateway:
    """``reef serve`` on the config of ``gateway_config``, once it answers /healthz."""
    config, port, database = gateway_config(workdir, upstreams)
    argv = [sys.executable, "-m", "reef", "serve", "-c", str(config), "--log-level", "WARNING"]
    process, log = children.spawn(f"reef-{port}", argv, child_env())
    url = f"http://127.0.0.1:{port}"
    wait_ready(process, log, url + "/healthz", 60)
    return Gateway(url, process, log, database)


def run_matrix(
    args: argparse.Namespace, workdir: Path, children: ChildProcesses
) -> tuple[list[Cell], float | None]:
    """Every chosen cell, in order; and the gateway's peak resident memory (MiB)."""
    cells: list[Cell] = []
    with (
        FakeUpstreamThread(huge_bytes=args.huge_mb * 1024 * 1024) as fake,
        full_accept_queue() as queue_port,
    ):
        upstreams = {
            "fake": fake.base_url,
            "refused": f"http://127.0.0.1:{free_port()}/v1",
            "blackhole": f"http://127.0.0.1:{queue_port}/v1",
        }
        gateway = start_gateway(children, workdir, upstreams)
        store = open_store(f"sqlite:///{gateway.database}")
        clients: dict[str, openai.OpenAI | anthropic.Anthropic] = {
            "openai": openai.OpenAI(
                base_url=gateway.url + "/v1", api_key="none", max_retries=0, timeout=120
            ),
            "anthropic": anthropic.Anthropic(
                base_url=gateway.url, api_key="none", max_retries=0, timeout=120
            ),
        }
        try:
            serial = 0
            chosen = [f for f in faults(args.huge_mb * 1024 * 1024) if f.name in args.fault_names]
            for fault in chosen:
                for dialect in args.dialect_names:
                    for stream in (False, True):
                        serial += 1
                        cell = run_cell(
                            fault,
                            dialect,
                            stream,
                            serial,
                            clients[_SDK[dialect]],
                            fake,
                            gateway,
                            store,
                        )
                        print(cell.line(), flush=True)
                        cells.append(cell)
            peak = gateway.peak_rss_mb()
        finally:
            for client in clients.values():
                client.close()
            store.close()
    return cells, peak


def markdown(
    command: str,
    cells: list[Cell],
    crash: CrashResult | None,
    seconds: float,
    load_before: tuple[float, float, float],
    peak_mb: float | None,
) -> str:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{value:.2f}" for value in load_before)
    right = sum(cell.outcome is Outcome.RIGHT for cell in cells)
    lines = [
        "## Fault matrix",
        "",
        f"Command: `{command}`",
        "",
        f"- Machine: {machine()}; {date}; load average before the run {load} "
        "(1, 5, 15 min); the whole run took "
        f"{seconds:.0f} s.",
        "- Gateway: `reef serve`, capture on, `sync` durability, SQLite; upstream "
        + ", ".join(f"`{key}: {value}`" for key, value in TIMEOUTS.items())
        + "; clients: the official `openai` and `anthropic` SDKs with `max_retries=0`.",
        f"- Cells right: **{right} of {len(cells)}**; the gateway's peak resident memory "
        f"over the matrix: {_mib(peak_mb)}.",
        "",
        "| fault | client | stream | client saw | attempts | record | gateway after | right |",
        "|---|---|---|---|---:|---|---|---|",
        *(cell.row() for cell in cells),
    ]
    if crash is not None:
        lines += ["", *crash.markdown()]
    lines += [
        "",
        "How to read it: *client* is an OpenAI client on an OpenAI-compatible upstream "
        "(`openai`), an Anthropic client on an Anthropic one (`anthropic`), or an Anthropic "
        "client on the OpenAI-compatible upstream, translated both ways (`translated`). "
        "*client saw* is the HTTP status and the error type in the "
        "client's dialect (OpenAI `error.type`, Anthropic `error.type`), or the answer; a "
        "stream that fails after its headers is a 200 whose last event is the dialect's "
        'error event (OpenAI `data: {"error": ...}`, Anthropic `event: error`) with the '
        "status it stands for, and never `[DONE]` or `message_stop`. *attempts* is what "
        "reached the fake upstream (retries happen only before the first byte, on "
        "connection errors, 429 and 5xx, honouring `Retry-After`). *record* is the stored "
        "record's status and the reason its error opens with (see "
        "[the HTTP API](http-api.md#inference)). *gateway after* is `/healthz` and a normal "
        "request of the same dialect, both answered, after the cell. An answer's size is "
        "bounded by its upstream's `max_response_bytes` (64 MiB by default, "
        "[bounded buffers](security.md#bounded-buffers)); the matrix raises it to 256 MiB, "
        "so the 100 MB answer is relayed whole and recorded, and those cells make the peak "
        "memory.",
    ]
    return "\n".join(lines)


def _mib(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0f} MiB"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "bench/faults.py", *argv])
    load_before = os.getloadavg()
    started = time.monotonic()
    crash: CrashResult | None = None
    with tempfile.TemporaryDirectory(prefix="reef-faults-") as tmp:
        children = ChildProcesses(Path(tmp))
        try:
            cells, peak_mb = run_matrix(args, Path(tmp) / "matrix", children)
            if args.crash_streams > 0:
                start = functools.partial(start_gateway, children, Path(tmp) / "crash")
                crash = crash_under_streams(start, args.crash_streams, args.kill_after)
                print(crash.text(), flush=True)
        except StartError as exc:
            print(f"could not start a gateway: {exc}", file=sys.stderr)
            return 2
        finally:
            children.stop_all()
    seconds = time.monotonic() - started
    wrong = [cell for cell in cells if cell.outcome is not Outcome.RIGHT]
    print(
        f"{len(cells) - len(wrong)} of {len(cells)} cells right in {seconds:.0f} s; "
        f"gateway peak memory {_mib(peak_mb)}"
    )
    if args.output is not None:
        text = markdown(command, cells, crash, seconds, load_before, peak_mb)
        write_between(args.output, START, END, text)
        print(f"wrote {args.output}")
    crash_ok = crash is None or crash.ok
    return 0 if not wrong and crash_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Live OTel export's CPU per span, on both sides of the pipe, on a fixed synthetic
workload: figures that hold on a loaded machine, where the throughput ratio of
``bench/otel_export.py`` does not.

    .venv/bin/python bench/otel_export_cpu.py --spans 20000 --repeats 5 --instructions \
        --output docs/benchmarks.md

The workload: seeded non-streaming chat records (as ``bench/load.py`` sends them, with
the fake upstream's answers), content off unless ``--capture-content``.

- gateway: what export on adds to a request (export off calls nothing):
  ``LiveExport.record()`` on a running event loop, its batch lines written to a real
  pipe whose reader throws them away; CPU of this process per span.
- export: what the export process spends on a span before sending it: parsing the batch
  line and encoding the OTLP protobuf request (``reef.telemetry.exporter.encode``); and
  the whole export process (``python -m reef.telemetry.exporter``) reading, encoding and
  sending to a real OTLP/HTTP receiver on loopback that must get every span: runs of N
  and 3N spans, start-up cancelled (CPU only).

Two measures: ``time.process_time()`` per span (the best of ``--repeats`` runs after a
warm-up; moves with cache contention on a loaded machine), and with ``--instructions``
the instructions per span counted by ``valgrind --tool=callgrind`` (repeatable under
load): each side run for N and 3N spans in a fresh interpreter, the difference over 2N,
so interpreter start-up and caches filled once cancel out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sections import write_between

START, END = "<!-- otel_export_cpu:start -->", "<!-- otel_export_cpu:end -->"
SIDES = ("gateway", "export")
_SINK = "import os, shutil, sys; shutil.copyfileobj(sys.stdin.buffer, open(os.devnull, 'wb'))"
_WORDS = [
    "the",
    "a",
    "order",
    "refund",
    "parcel",
    "late",
    "please",
    "help",
    "when",
    "where",
    "why",
    "account",
    "card",
    "ship",
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--spans", type=int, default=20000, help="per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the best counts")
    parser.add_argument("--capture-content", action="store_true", help="spans carry messages")
    parser.add_argument(
        "--instructions", action="store_true", help="also count instructions with callgrind"
    )
    parser.add_argument(
        "--instruction-spans",
        type=int,
        default=512,
        help="N of the callgrind runs (N, 3N): a multiple of the batch size, 512",
    )
    parser.add_argument("--side", choices=SIDES, help="run one side once (for callgrind)")
    parser.add_argument("--built", type=int, default=0, help="with --side: records built")
    parser.add_argument("--note", default="", help="a line about the machine, for the report")
    parser.add_argument("--output", type=Path, help="markdown file whose section to rewrite")
    args = parser.parse_args(argv)
    if min(args.spans, args.repeats, args.instruction_spans) < 1:
        parser.error("--spans, --repeats and --instruction-spans must be at least 1")
    return args


def config(capture_content: bool) -> Any:
    from reef.config import OtelConfig

    return OtelConfig(
        enabled=True,
        capture_content=capture_content,
        max_queue_size=1 << 20,
        schedule_delay_seconds=3600,  # only full batches: the same lines every run
    )


def drafts(count: int) -> list[Any]:
    """``count`` seeded chat records, as the gateway writes them."""
    from reef.experience import RecordDraft

    rng = random.Random(40)
    out = []
    for serial in range(count):
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 30)))
        messages = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": text},
        ]
        prompt = len(text.split()) + 2
        completion = prompt + 1
        response = {
            "id": f"chatcmpl-fake{serial}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "reef/support",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"echo: {text}"},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
        out.append(
            RecordDraft(
                id=f"0193a1b2-{serial:04x}-7{rng.getrandbits(12):03x}-8{rng.getrandbits(60):015x}",
                scenario="support",
                session_id=f"sess-{rng.getrandbits(64):016x}",
                api="openai.chat",
                request={"model": "reef/support", "messages": messages},
                response=response,
                status="ok",
                error=None,
                latency_ms=rng.uniform(2, 40),
                usage=response["usage"],
                release_id="rel-0001",
                prompt_hash="p",
                content_hash="c",
                continuation_hash=None,
            )
        )
    return out


def gateway_seconds(records: list[Any], capture_content: bool) -> float:
    """CPU seconds of this process for ``LiveExport.record()`` of every record on an
    event loop, batches written to the pipe."""
    from reef.telemetry.live import LiveExport

    settings = config(capture_content)
    batch = settings.max_export_batch_size

    async def drive() -> float:
        live = LiveExport(settings, command=[sys.executable, "-c", _SINK])
        try:
            began = time.process_time()
            for start in range(0, len(records), batch):
                for draft in records[start : start + batch]:
                    live.record(draft, "openai", None)
                await asyncio.sleep(0)  # the batch is written (call_soon)
                await asyncio.sleep(0)
            spent = time.process_time() - began
            assert live.dropped_spans == 0, f"{live.dropped_spans} span(s) dropped"
            return spent
        finally:
            live.shutdown()

    return asyncio.run(drive())


def batch_lines(records: list[Any], capture_content: bool) -> list[bytes]:
    """The lines the gateway writes for ``records``: what the export process reads."""
    from reef.core import dumps
    from reef.telemetry.live import LiveExport, wire_record

    settings = config(capture_content)
    now = 1_733_370_000_000_000_000
    items = [
        dumps(wire_record(draft, "openai", None, now + i, capture_content))
        for i, draft in enumerate(records)
    ]
    size = settings.max_export_batch_size
    return [LiveExport._line(items[i : i + size]) for i in range(0, len(items), size)]


def export_seconds(lines: list[bytes], capture_content: bool) -> tuple[float, int]:
    """CPU seconds of parsing and encoding ``lines`` as the export process does, and
    the bytes of protobuf written."""
    from opentelemetry.sdk.resources import Resource

    from reef.core import loads
    from reef.telemetry.exporter import encode

    settings = config(capture_content)
    resource = dict(Resource.create({"service.name": settings.service_name}).attributes)
    written = 0
    began = time.process_time()
    for line in lines:
        batches, broken = encode(loads(line), settings, resource)
        assert not broken
        written += sum(len(b.payload) for b in batches)
    return time.process_time() - began, written


def process_seconds(lines: list[bytes], spans: int, capture_content: bool) -> float:
    """CPU seconds (user and system) of a whole export process (``python -m
    reef.telemetry.exporter``, interpreter start-up included) that reads ``lines`` and
    sends them to a real OTLP/HTTP receiver on loopback, which must get every span."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.fakes.otlp import OtlpReceiver

    from reef.core import dumps

    with OtlpReceiver() as receiver:
        settings = config(capture_content).model_copy(update={"endpoint": receiver.traces_url})
        process = subprocess.Popen(
            [sys.executable, "-m", "reef.telemetry.exporter"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
        assert process.stdin is not None
        process.stdin.write(dumps(settings.model_dump(mode="json")) + b"\n")
        for line in lines:
            process.stdin.write(line)
        process.stdin.close()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        received = len(receiver.spans)
    if process.returncode != 0 or received != spans:
        raise SystemExit(f"export process: exit {process.returncode}, {received} of {spans} spans")
    return usage.ru_utime + usage.ru_stime


def run_side(side: str, spans: int, built: int, capture_content: bool) -> float:
    """One side on the first ``spans`` of ``built`` records (the inputs built for the
    largest run, so that building them cancels out of a difference of two runs)."""
    records = drafts(max(built, spans))
    if side == "gateway":
        return gateway_seconds(records[:spans], capture_content)
    lines = batch_lines(records, capture_content)
    batches = -(-spans // config(capture_content).max_export_batch_size)
    return export_seconds(lines[:batches], capture_content)[0]


def whole_process(args: argparse.Namespace) -> float:
    """µs per span of the whole export process: runs of N and 3N spans (N =
    ``--spans``), the difference over 2N (start-up cancels out); the best of
    ``--repeats`` pairs."""
    small = batch_lines(drafts(args.spans), args.capture_content)
    large = batch_lines(drafts(3 * args.spans), args.capture_content)
    differences = [
        process_seconds(large, 3 * args.spans, args.capture_content)
        - process_seconds(small, args.spans, args.capture_content)
        for _ in range(args.repeats)
    ]
    return min(differences) / (2 * args.spans) * 1e6


def timed(args: argparse.Namespace) -> dict[str, float]:
    """Best µs per span of each side over ``--repeats`` runs, after one warm-up run."""
    records = drafts(args.spans)
    lines = batch_lines(records, args.capture_content)
    best: dict[str, float] = {"process": whole_process(args)}
    for side in SIDES:
        runs = []
        for _ in range(args.repeats + 1):
            if side == "gateway":
                runs.append(gateway_seconds(records, args.capture_content))
            else:
                runs.append(export_seconds(lines, args.capture_content)[0])
        best[side] = min(runs[1:]) / args.spans * 1e6
    return best


def instructions(args: argparse.Namespace) -> dict[str, float]:
    """Instructions per span of each side: callgrind runs of N and 3N spans."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind on PATH")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    counts: dict[str, float] = {}
    n = args.instruction_spans
    for side in SIDES:
        totals = []
        for spans in (n, 3 * n):
            argv = [
                valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null",
                sys.executable, __file__, "--side", side, "--spans", str(spans),
                "--built", str(3 * n),
            ]  # fmt: skip
            if args.capture_content:
                argv.append("--capture-content")
            done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
            found = re.search(r"Collected : (\d+)", done.stderr)
            if done.returncode != 0 or found is None:
                raise SystemExit(f"callgrind run failed:\n{done.stderr[-2000:]}")
            totals.append(int(found.group(1)))
        counts[side] = (totals[1] - totals[0]) / (2 * n)
    return counts


def report(args: argparse.Namespace, best: dict[str, float], counted: dict[str, float]) -> str:
    argv = shlex.join(sys.argv[1:])
    load = os.getloadavg()[0]
    content = "on" if args.capture_content else "off"
    lines = [
        "## Live OTel export: CPU per span, gateway and export process",
        f"`python bench/otel_export_cpu.py {argv}`",
        "",
        f"{args.spans} seeded chat records per timed run (content {content}), the best of "
        f"{args.repeats} runs after a warm-up; load average at the end: {load:.2f}. "
        f"{args.note}".rstrip(),
        "",
        "| side | CPU µs/span | instructions/span |",
        "|---|---|---|",
    ]
    for side, what in (
        ("gateway", "gateway: `LiveExport.record()` + batch write (export off: 0)"),
        ("export", "export process: parse + encode"),
        ("process", "export process, whole: start-up cancelled, read, encode, send (HTTP)"),
    ):
        count = f"{counted[side]:,.0f}" if side in counted else "not counted"
        lines.append(f"| {what} | {best[side]:.2f} | {count} |")
    if counted:
        lines.append("")
        lines.append(
            f"Instructions: callgrind, {args.instruction_spans} and "
            f"{3 * args.instruction_spans} spans, the difference over "
            f"{2 * args.instruction_spans} (inputs built for "
            f"{3 * args.instruction_spans} in both, so building them cancels out)."
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.side is not None:
        spent = run_side(args.side, args.spans, args.built, args.capture_content)
        print(f"{args.side}: {spent / args.spans * 1e6:.2f} µs/span")
        return 0
    best = timed(args)
    counted = instructions(args) if args.instructions else {}
    text = report(args, best, counted)
    print(text)
    if args.output is not None:
        write_between(args.output, START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``reef import``'s rate and memory: records/s and peak RSS importing an OpenAI
fine-tuning file of N lines (1M by default) into a fresh SQLite store.

    .venv/bin/python bench/import_export.py --records 1000000 --output docs/benchmarks.md

Each size (``--records``, and a tenth of it, so the report shows whether memory stays
flat as the file grows) is one run: the file is generated in a temporary folder (each
line a distinct system/user/assistant conversation, so nothing is deduplicated), then
``python -m reef import FILE --scenario bench --format openai-finetune --json`` runs as
a child process in a fresh home (``./.reef``, SQLite, ``sync`` writes in batches of
``BATCH_LINES`` lines, checkpoints on), exactly as an operator would run it. The rate is
records over the child's wall time (process start and imports included); the peak memory is the
child's maximum resident set size (``wait4``'s ``ru_maxrss``). The summary's counts are
checked: every line imported, one demonstration (feedback) each, nothing skipped.

It also measures the other half of issue 40's figures, gateway throughput at
concurrency 32 with live OTel export on vs off (target: at least 0.95x), by running
``bench/otel_export.py`` (needs the ``otel`` extra; its own section of the report)::

    .venv/bin/python bench/import_export.py --records 1000000 --output docs/benchmarks.md \
        --part both --otel-requests 10000 --otel-warmup 1000 --otel-runs 20

``--part import`` (the default, as ``reef bench`` runs it) or ``--part otel`` runs one
half only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import otel_export
from sections import write_between

from reef.experience.importing.runner import BATCH_LINES, SESSION_MEMORY

START, END = "<!-- import_export:start -->", "<!-- import_export:end -->"
SCENARIO = "bench"
FULL_SIZE = 1_000_000  # issue 40's size; a smaller run reports its extrapolation as such


@dataclass(frozen=True)
class ImportRun:
    """One import of ``records`` lines: wall seconds, peak RSS and the file's size."""

    records: int
    file_bytes: int
    seconds: float
    peak_rss_bytes: int
    cpu_seconds: float = 0.0  # the child's user + system CPU

    @property
    def cpu_rate(self) -> float:
        """Records imported per second of the child's CPU: less dependent on the
        machine's load than the wall-clock rate."""
        return self.records / self.cpu_seconds if self.cpu_seconds else 0.0

    @property
    def rate(self) -> float:
        """Records imported per second of the child's wall time."""
        return self.records / self.seconds


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=1_000_000, help="lines of the large file")
    parser.add_argument(
        "--no-small", action="store_true", help="skip the run at a tenth of --records"
    )
    parser.add_argument(
        "--part",
        choices=("import", "otel", "both"),
        default="import",
        help="import rate and memory, OTel export on vs off at c=32 (bench/otel_export.py), "
        "or both",
    )
    parser.add_argument("--otel-requests", type=int, default=2000, help="otel: per round")
    parser.add_argument("--otel-warmup", type=int, default=200, help="otel: before each round")
    parser.add_argument("--otel-runs", type=int, default=6, help="otel: rounds per target")
    parser.add_argument("--concurrency", type=int, default=32, help="otel: concurrent clients")
    parser.add_argument(
        "--line-bytes",
        type=int,
        default=0,
        help="pad each line to about this many bytes (a multi-GB file: 250000 x 10000)",
    )
    parser.add_argument("--note", default="", help="a line about the machine, for the report")
    parser.add_argument("--output", type=Path, help="markdown file whose section to rewrite")
    return parser.parse_args(argv)


def write_finetune_file(path: Path, count: int, line_bytes: int = 0) -> int:
    """``count`` distinct ``{"messages": [...]}`` lines; returns the file's size. With
    ``line_bytes``, each user message carries a catalogue excerpt that brings its line
    to about that size (a multi-GB file with fewer records)."""
    with path.open("w", encoding="utf-8") as out:
        for index in range(count):
            question = f"What does item {index} cost? In stock?"
            if line_bytes > 0:
                question = _padded(question, index, line_bytes)
            line = {
                "messages": [
                    {"role": "system", "content": "You answer questions about the catalogue."},
                    {"role": "user", "content": question},
                    {
                        "role": "assistant",
                        "content": f"Item {index} costs {index % 97 + 3}.50 and "
                        f"{'is' if index % 3 else 'is not'} in stock.",
                    },
                ]
            }
            out.write(json.dumps(line) + "\n")
    return path.stat().st_size


def _padded(question: str, index: int, line_bytes: int) -> str:
    """``question`` after catalogue lines (distinct per ``index``) of about
    ``line_bytes`` bytes in all."""
    entries: list[str] = []
    size = len(question) + 250  # the rest of the line
    entry = 0
    while size < line_bytes:
        text = f"item {index}-{entry}: price {(index * 7 + entry) % 997}.50, shelf {entry % 40}."
        entries.append(text)
        size += len(text) + 1
        entry += 1
    return "\n".join([*entries, question])


def run_import(folder: Path, count: int, line_bytes: int = 0) -> ImportRun:
    """Generate a file of ``count`` lines in ``folder`` and import it as a child process."""
    folder.mkdir(parents=True)
    source = folder / "train.jsonl"
    size = write_finetune_file(source, count, line_bytes)
    command = [
        sys.executable,
        "-m",
        "reef",
        "import",
        str(source),
        "--scenario",
        SCENARIO,
        "--format",
        "openai-finetune",
        "--json",
    ]
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert child.stdout is not None
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"reef import exited {child.returncode}: {output[-2000:]!r}")
    summary = json.loads(output)
    expected = (count, count, 0)
    found = (summary["records"], summary["feedback"], summary["skipped"])
    if found != expected:
        raise SystemExit(f"import summary {found} is not {expected} (records, feedback, skipped)")
    # ru_maxrss is in kilobytes on Linux.
    cpu = usage.ru_utime + usage.ru_stime
    return ImportRun(count, size, seconds, usage.ru_maxrss * 1024, cpu)


def report(
    runs: list[ImportRun],
    note: str,
    argv: list[str],
    load: tuple[float, float],
    line_bytes: int = 0,
) -> str:
    """The markdown section: command, machine note, one row per size."""
    command = "python bench/import_export.py " + " ".join(shlex.quote(a) for a in argv)
    lines = [
        "## Import: `reef import` rate and memory",
        "",
        f"`{command}`",
        "",
    ]
    lines += [f"Load average before/after: {load[0]:.2f} / {load[1]:.2f}. {note}".strip(), ""]
    lines += [
        "| records | file (MB) | wall (s) | records/s | CPU (s) | records/CPU-s | peak RSS (MB) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        lines.append(
            f"| {run.records:,} | {run.file_bytes / 1e6:.1f} | {run.seconds:.1f} | "
            f"{run.rate:,.0f} | {run.cpu_seconds:.1f} | {run.cpu_rate:,.0f} | "
            f"{run.peak_rss_bytes / 2**20:.1f} |"
        )
    largest = max(runs, key=lambda run: run.records)
    if line_bytes > 0:
        lines += [
            "",
            f"Lines padded to about {line_bytes:,} bytes (`--line-bytes`): a file of "
            f"{largest.file_bytes / 1e9:.2f} GB from {largest.records:,} records, so peak "
            "memory is seen against the file's size.",
        ]
    elif largest.records < FULL_SIZE:
        minutes = FULL_SIZE / largest.rate / 60
        lines += [
            "",
            f"**Extrapolated, not measured:** {FULL_SIZE:,} records at the {largest.records:,}"
            f"-record run's rate would take about {minutes:.0f} min. Memory is expected to "
            "level off near the largest row's, not measured at that size: the import holds "
            f"one batch of {BATCH_LINES:,} lines and at most {SESSION_MEMORY:,} continuation "
            "hashes for "
            f"session inference, a cap a run of {SESSION_MEMORY:,} records or more reaches "
            "(the rise between the rows is of that order).",
        ]
    lines += [
        "",
        "One `reef import` child process per row (openai-finetune lines, each a record and "
        "its demonstration feedback, into a fresh SQLite store); the rate counts the "
        "process start; peak RSS is the child's maximum resident set.",
        "The benchmark's other figure, gateway throughput at c=32 with live OTel export "
        "on vs off (`--part otel`, which runs `bench/otel_export.py`), is in "
        "[its own section](#live-otel-export-throughput-with-export-on-vs-off).",
    ]
    return "\n".join(lines)


def otel_argv(args: argparse.Namespace) -> list[str]:
    """``bench/otel_export.py``'s command line for this run's ``--otel-*`` options."""
    argv = [
        "--requests",
        str(args.otel_requests),
        "--warmup",
        str(args.otel_warmup),
        "--runs",
        str(args.otel_runs),
        "--concurrency",
        str(args.concurrency),
    ]
    if args.note:
        argv += ["--note", args.note]
    if args.output is not None:
        argv += ["--output", str(args.output)]
    return argv


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.part in ("import", "both"):
        measure_import(args, argv)
    if args.part in ("otel", "both"):
        return otel_export.main(otel_argv(args))
    return 0


def measure_import(args: argparse.Namespace, argv: list[str]) -> None:
    """Import ``--records`` lines (and a tenth of it), report, write the section."""
    sizes = [args.records] if args.no_small else [max(args.records // 10, 1), args.records]
    runs = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="reef-import-bench-") as tmp:
        for count in sizes:
            run = run_import(Path(tmp) / str(count), count, args.line_bytes)
            print(
                f"{count:>10,} records: {run.seconds:8.1f} s  {run.rate:10,.0f} records/s  "
                f"CPU {run.cpu_seconds:8.1f} s  peak RSS {run.peak_rss_bytes / 2**20:8.1f} MB  "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            runs.append(run)
    text = report(runs, args.note, argv, (load_before, os.getloadavg()[0]), args.line_bytes)
    print()
    print(text)
    if args.output is not None:
        write_between(args.output, START, END, text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The gateway's ``sync`` write path alone: CPU per record for SQLite record batches,
the schema as it is next to the same schema with one more index, side by side.

    .venv/bin/python bench/record_writes.py --output docs/benchmarks.md

For each batch size (``--batches``), two fresh stores are filled with ``--prefill``
records (so every index is a tree of realistic depth), one of them with an extra index
(``--extra-index``, by default the one migration 0014 dropped: ``records.content_hash``,
a uniformly random hash that no query reads). Then ``--records`` more go in as the
gateway writes them (``write_records``: on SQLite ``SQLiteRecordWriter``, one
transaction per batch), rounds alternating between the stores. Reported per record:
wall time, the writing thread's CPU, and the process's CPU, which adds the WAL
checkpointer's thread. Records look like the overhead benchmark's traffic: a
two-message chat and its answer, each in a session of its own, with the hashes a new
conversation gets.
"""

from __future__ import annotations

import argparse
import datetime
import resource
import secrets
import shlex
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from reef.core.ids import new_id
from reef.experience.backends import open_store
from reef.experience.records import RecordDraft
from reef.experience.sql.store import SQLExperienceStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead_report import machine
from sections import write_between

START, END = "<!-- record_writes:start -->", "<!-- record_writes:end -->"
SCENARIO = "default"


def draft(number: int) -> RecordDraft:
    """A record as the overhead benchmark's traffic makes them."""

    def digest() -> str:
        return "sha256:" + secrets.token_hex(32)

    answer = f"Hello! This is reply {number} from the fake model."
    return RecordDraft(
        id=new_id(),
        scenario=SCENARIO,
        session_id=secrets.token_hex(16),
        api="openai.chat",
        request={
            "model": "fake-model",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"Say hello to request {number}"},
            ],
        },
        response={
            "id": "chatcmpl-" + secrets.token_hex(8),
            "object": "chat.completion",
            "model": "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32},
        },
        status="ok",
        error=None,
        latency_ms=1.2,
        usage={"prompt_tokens": 20, "completion_tokens": 12},
        release_id=new_id(),
        prompt_hash=digest(),
        content_hash=digest(),
        continuation_hash=digest(),
    )


@dataclass
class Round:
    """One measured round of one store: per record, µs."""

    wall: float
    thread_cpu: float
    process_cpu: float


class Contender:
    """A store filled with ``prefill`` records, with ``extra_index`` created or not."""

    def __init__(self, path: Path, prefill: int, extra_index: str | None) -> None:
        self.path = path
        self.name = "schema" if extra_index is None else f"schema + index on {extra_index}"
        self.store: SQLExperienceStore = open_store(f"sqlite:///{path}")
        if extra_index is not None:
            _execute(path, f"CREATE INDEX bench_extra ON records ({extra_index})")
        for start in range(0, prefill, 1000):
            self.store.write_records([draft(start + n) for n in range(1000)])
        self.sent = prefill

    def measure(self, batch: int, records: int) -> Round:
        batches = [[draft(self.sent + i * batch + j) for j in range(batch)]
                   for i in range(max(1, records // batch))]  # fmt: skip
        count = len(batches) * batch
        self.sent += count
        process0 = resource.getrusage(resource.RUSAGE_SELF)
        thread0 = time.thread_time()
        wall0 = time.perf_counter()
        for drafts in batches:  # on SQLite, the gateway's write path (SQLiteRecordWriter)
            self.store.write_records(drafts)
        wall = time.perf_counter() - wall0
        thread = time.thread_time() - thread0
        _execute(self.path, "PRAGMA wal_checkpoint(PASSIVE)")  # what is left to copy
        process1 = resource.getrusage(resource.RUSAGE_SELF)
        process = (process1.ru_utime + process1.ru_stime) - (process0.ru_utime + process0.ru_stime)
        return Round(1e6 * wall / count, 1e6 * thread / count, 1e6 * process / count)

    def close(self) -> None:
        self.store.close()


def _execute(path: Path, statement: str) -> None:
    """Run ``statement`` on a connection of its own to the store at ``path``."""
    conn = sqlite3.connect(path)
    try:
        conn.execute(statement)
    finally:
        conn.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prefill", type=int, default=100_000, help="records in each store")
    parser.add_argument("--records", type=int, default=20_000, help="measured per round")
    parser.add_argument("--batches", default="1,4,16", help="records per transaction")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per store")
    parser.add_argument("--extra-index", default="content_hash", help="records column(s)")
    parser.add_argument("--output", type=Path, help="markdown file whose section to rewrite")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.batches.split(",")]
    if min(sizes) < 1 or args.records < 1 or args.rounds < 1 or args.prefill < 0:
        parser.error("--batches, --records and --rounds must be at least 1")
    rows = []
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="reef-record-writes-") as tmp:
            contenders = [
                Contender(Path(tmp) / "a.db", args.prefill, None),
                Contender(Path(tmp) / "b.db", args.prefill, args.extra_index),
            ]
            measured: dict[str, list[Round]] = {c.name: [] for c in contenders}
            try:
                for turn in range(args.rounds):
                    for contender in contenders[turn % 2 :] + contenders[: turn % 2]:
                        found = contender.measure(size, args.records)
                        measured[contender.name].append(found)
                        print(
                            f"batch {size:>3}  {contender.name:<40} wall {found.wall:6.1f}  "
                            f"thread CPU {found.thread_cpu:6.1f}  process CPU "
                            f"{found.process_cpu:6.1f} µs/record",
                            flush=True,
                        )
            finally:
                for contender in contenders:
                    contender.close()
        base = measured[contenders[0].name]
        for name, found in measured.items():
            ratio = statistics.median(r.process_cpu for r in found) / statistics.median(
                r.process_cpu for r in base
            )
            rows.append(
                f"| {size} | {name} | {_median(found, 'wall')} | {_median(found, 'thread_cpu')} "
                f"| {_median(found, 'process_cpu')} | {ratio:.2f}x |"
            )
    text = "\n".join(
        [
            "### The record write path alone (`bench/record_writes.py`)",
            "",
            f"Command: `{shlex.join(['python', 'bench/record_writes.py', *argv])}`",
            "",
            f"- Machine: {machine()}, SQLite {sqlite3.sqlite_version}; "
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.",
            f"- {args.prefill:,} records in each store first; {args.records:,} measured per "
            f"round, {args.rounds} rounds per store alternating; medians. Process CPU adds "
            "the WAL checkpointer's thread (and the copy left for it after the round).",
            "",
            "| records per transaction | store | wall µs/record | writing thread CPU "
            "µs/record | process CPU µs/record | process CPU vs schema |",
            "| ---: | --- | ---: | ---: | ---: | ---: |",
            *rows,
        ]
    )
    print(text)
    if args.output is not None:
        write_between(args.output, START, END, text)
    return 0


def _median(rounds: list[Round], name: str) -> str:
    return f"{statistics.median(getattr(r, name) for r in rounds):.1f}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

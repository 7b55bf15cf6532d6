"""``python -m bench [OPTIONS]``, from the repository root: run every benchmark of this
checkout, one after another, and rewrite docs/benchmarks.md.

The one way in to the benchmarks: they are a developer's tool for a clone of the
repository, not a command of the installed product. What runs is registered in
``bench/registry.py``; ``bench/runner.py`` runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from bench.registry import DOCS
from bench.runner import find_bench_dir, print_list, print_summary, run_bench, select_benches

from reef.core.errors import NotFoundError, ReefError


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
        typer.Option(help="The bench/ directory whose scripts run (default: this one)."),
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
    selected = select_benches(only or [])
    if list_only:
        print_list(found, quick, should_write)
        return
    outcomes = []
    for index, bench in enumerate(selected, 1):
        typer.echo(f"==> [{index}/{len(selected)}] {bench.name}: {bench.title}")
        outcome = run_bench(bench, found, quick, should_write, timeout_seconds)
        typer.echo(f"<== {bench.name}: {outcome.status} {outcome.detail}".rstrip())
        outcomes.append(outcome)
    print_summary(outcomes, should_write)
    if any(o.status in ("failed", "timeout") for o in outcomes):
        raise typer.Exit(1)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(bench_command)

if __name__ == "__main__":
    try:
        app()
    except ReefError as exc:  # as `reef` reports them: a message and an exit code
        print(f"error: {exc.message}", file=sys.stderr)
        sys.exit(3 if isinstance(exc, NotFoundError) else 2)

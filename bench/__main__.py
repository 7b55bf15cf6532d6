"""``python -m bench [OPTIONS]`` from the repository root: the same as ``reef bench``."""

from __future__ import annotations

import sys

import typer

from reef.cli.bench import bench_command
from reef.core.errors import NotFoundError, ReefError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(bench_command)

if __name__ == "__main__":
    try:
        app()
    except ReefError as exc:  # as `reef` reports them: a message and an exit code
        print(f"error: {exc.message}", file=sys.stderr)
        sys.exit(3 if isinstance(exc, NotFoundError) else 2)

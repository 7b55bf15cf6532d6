"""``reef engine``: run the embedded local model server on its own.

Mounted by the ``reef`` command as ``reef engine``; also ``python -m reef.engine``.
Torch is imported only when a command runs, so ``reef --help`` stays fast.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

engine_app = typer.Typer(
    name="engine",
    help="The embedded local model server (OpenAI-compatible, vLLM adapter API).",
    no_args_is_help=True,
    add_completion=False,
)


@engine_app.callback()
def _group() -> None:
    """The embedded local model server."""


@engine_app.command("serve")
def serve(
    model: Annotated[
        str, typer.Option(help="smollm2-135m, tiny-random, or a Hugging Face model directory.")
    ] = "smollm2-135m",
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one.", min=0)] = 8601,
    home: Annotated[Path, typer.Option(help="Reef home (model cache lives here).")] = Path(".reef"),
    max_batch: Annotated[int, typer.Option(help="Most sequences decoded together.", min=1)] = 16,
    threads: Annotated[
        int | None, typer.Option(help="Torch threads (default: all cores but one).", min=1)
    ] = None,
    parent_pid: Annotated[
        int | None,
        typer.Option(help="Exit when this process (our parent) dies. Linux only."),
    ] = None,
) -> None:
    """Serve a model until SIGINT/SIGTERM.

    Once listening, prints one line ``REEF_ENGINE_READY {json}`` to stdout with the
    bound host and port; logs go to stderr.
    """
    from reef.engine.process import ReadyInfo, exit_with_parent, ready_line

    if parent_pid is not None:
        exit_with_parent(parent_pid)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from reef.core.errors import optional_dependency
    from reef.engine.errors import ModelSourceError

    with optional_dependency("local", "the embedded engine"):
        from reef.engine.server import run_server

    def announce(bound: int) -> None:
        print(ready_line(ReadyInfo(host, bound, model)), flush=True)

    try:
        run_server(model, host, port, home, announce, max_batch=max_batch, threads=threads)
    except ModelSourceError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from exc

"""``python -m reef.engine serve …``: the engine's own command line, which ``reef serve``
starts it with as a child (``process.engine_command``) and ``reef engine serve`` wraps.

Torch is imported only once a model is to be served.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from reef.engine.process import (
    ENGINE_BACKENDS,
    ENGINE_DTYPES,
    EngineOptions,
    ReadyInfo,
    exit_with_parent,
    ready_line,
)


def serve_until_stopped(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8601,
    home: Path = Path(".reef"),
    options: EngineOptions | None = None,
    parent_pid: int | None = None,
) -> int:
    """Serve ``model`` until SIGINT/SIGTERM; return the exit status (2 for a model
    source the engine cannot load, named on stderr). Once listening, prints one line
    ``REEF_ENGINE_READY {json}`` to stdout with the bound host and port; logs go to
    stderr."""
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
        run_server(model, host, port, home, announce, options=options or EngineOptions())
    except ModelSourceError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``serve`` and its options (the same as ``reef engine serve``'s), and serve."""
    parser = argparse.ArgumentParser(prog="python -m reef.engine")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="Serve a model until SIGINT/SIGTERM.")
    serve.add_argument("--model", default="smollm2-135m")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8601)
    serve.add_argument("--home", type=Path, default=Path(".reef"))
    serve.add_argument("--max-batch", type=int, default=16)
    serve.add_argument("--threads", type=int, default=None)
    serve.add_argument("--dtype", choices=ENGINE_DTYPES, default="float32")
    serve.add_argument("--prefix-cache-mb", type=int, default=256)
    serve.add_argument("--backend", choices=ENGINE_BACKENDS, default="eager")
    serve.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    if args.prefix_cache_mb < 0:
        parser.error("--prefix-cache-mb must be 0 (off) or more")
    options = EngineOptions(
        max_batch=args.max_batch,
        threads=args.threads,
        dtype=args.dtype,
        prefix_cache_mb=args.prefix_cache_mb,
        backend=args.backend,
    )
    return serve_until_stopped(
        args.model, args.host, args.port, args.home, options, args.parent_pid
    )

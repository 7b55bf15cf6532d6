"""``reef engine``: run the embedded local model server on its own.

Mounted by the ``reef`` command as ``reef engine``; ``python -m reef.engine`` is the
engine's own command line (``reef.engine.command``), which this wraps.
Torch is imported only when a command runs, so ``reef --help`` stays fast.
"""

from __future__ import annotations

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
    dtype: Annotated[
        str,
        typer.Option(
            help="Weights' precision: float32, float16 (weights in float16 for fbgemm, "
            "float32 activations: x86 CPUs), bfloat16, int8 (weight-only, bfloat16 "
            "activations), or auto (on a GPU bfloat16; on a CPU float16 where fbgemm runs, "
            "else bfloat16 where the CPU computes it natively: AVX-512 BF16 or AMX, else "
            "float32)."
        ),
    ] = "float32",
    prefix_cache_mb: Annotated[
        int,
        typer.Option(
            help="MiB of prompt prefixes' keys and values kept for reuse (requests that "
            "start alike prefill only what differs); 0 turns it off.",
            min=0,
        ),
    ] = 256,
    backend: Annotated[
        str,
        typer.Option(
            help="What runs the model: eager (PyTorch), openvino (OpenVINO GenAI, the "
            "openvino extra; the model is converted once into ./.reef/models/openvino; "
            "float32, float16 or int8 weights, float32 arithmetic; auto: float32; "
            "no checkpoints or prefix cache yet; docs/engine.md), or auto (the fastest "
            "backend and precision whose greedy answers agree with the eager engine's on "
            "95% of a probe set on this CPU, calibrated once and cached in "
            "<home>/engine/backend-choice.json; eager without the openvino extra)."
        ),
    ] = "eager",
    parent_pid: Annotated[
        int | None,
        typer.Option(help="Exit when this process (our parent) dies. Linux only."),
    ] = None,
) -> None:
    """Serve a model until SIGINT/SIGTERM.

    Once listening, prints one line ``REEF_ENGINE_READY {json}`` to stdout with the
    bound host and port; logs go to stderr.
    """
    from reef.engine.command import serve_until_stopped
    from reef.engine.process import ENGINE_BACKENDS, ENGINE_DTYPES, EngineOptions

    if dtype not in ENGINE_DTYPES:
        raise typer.BadParameter(
            f"{dtype!r} is not one of {', '.join(ENGINE_DTYPES)}", param_hint="--dtype"
        )
    if backend not in ENGINE_BACKENDS:
        raise typer.BadParameter(
            f"{backend!r} is not one of {', '.join(ENGINE_BACKENDS)}", param_hint="--backend"
        )
    options = EngineOptions(
        max_batch=max_batch,
        threads=threads,
        dtype=dtype,  # type: ignore[arg-type]
        prefix_cache_mb=prefix_cache_mb,
        backend=backend,  # type: ignore[arg-type]
    )
    status = serve_until_stopped(model, host, port, home, options, parent_pid)
    if status:
        raise typer.Exit(status)

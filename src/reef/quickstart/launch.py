"""The quickstart's way in: check the options as given on the command line, check what
is installed, then run. The work is in ``session``, imported only after those checks,
so a missing package gets a message instead of a traceback."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reef.core.errors import InvalidInputError
from reef.engine.process import ENGINE_DTYPES
from reef.quickstart.errors import check_requirements

MODELS = ("smollm2-135m", "tiny-random")
FEEDBACK = ("explicit", "implicit")
TASKS = ("triage", "agent", "distill")
# Sizes per task when not given: an agent's episode is two or three model calls, each
# with the tools in its prompt, so it gets fewer.
DEFAULT_REQUESTS = {"triage": 120, "agent": 60, "distill": 240}
DEFAULT_HELDOUT = {"triage": 60, "agent": 30, "distill": 60}


@dataclass(frozen=True)
class GivenOptions:
    """The command line as given (``reef quickstart --help`` describes each); checked
    by ``start_quickstart``. ``None`` sizes take the task's default, an empty ``dtype``
    the machine's (``default_dtype``)."""

    directory: Path
    rounds: int
    requests: int | None
    model: str
    heldout: int | None
    port: int | None
    seed: int
    fresh: bool
    demos: int
    feedback: str
    task: str
    dtype: str


def start_quickstart(given: GivenOptions) -> None:
    """Check the options and the installed extras, then run the quickstart in
    ``given.directory``. Raises ``InvalidInputError`` naming the option that is wrong,
    ``MissingExtraError`` or ``QuickstartError`` naming what to install."""
    model, feedback, task, dtype = given.model, given.feedback, given.task, given.dtype
    if model not in MODELS:
        raise InvalidInputError(f"--model must be one of {', '.join(MODELS)}, not {model!r}")
    if feedback not in FEEDBACK:
        raise InvalidInputError(f"--feedback must be explicit or implicit, not {feedback!r}")
    if task not in TASKS:
        raise InvalidInputError(f"--task must be triage, agent or distill, not {task!r}")
    if task == "agent" and feedback != "explicit":
        raise InvalidInputError("--task agent grades outcomes: --feedback implicit is triage's")
    if task == "distill" and feedback != "explicit":
        raise InvalidInputError(
            "--task distill learns from the teacher's answers, without feedback: "
            "--feedback implicit is triage's"
        )
    if dtype and dtype not in ENGINE_DTYPES:
        raise InvalidInputError(f"--dtype must be one of {', '.join(ENGINE_DTYPES)}, not {dtype!r}")
    check_requirements(model)
    if not dtype:
        dtype = default_dtype()
    from reef.quickstart.session import Options, run_quickstart

    sizes = (
        given.requests or DEFAULT_REQUESTS[task],
        given.heldout or DEFAULT_HELDOUT[task],
    )
    run_quickstart(
        Options(
            given.directory,
            given.rounds,
            sizes[0],
            model,
            sizes[1],
            given.port,
            given.seed,
            given.fresh,
            given.demos,
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

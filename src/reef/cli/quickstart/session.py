"""What ``reef quickstart`` does, once its options are checked.

Reads top to bottom: check what is installed, prepare the directory and its
configuration, start the engine, gateway and worker, measure the first release on the
held-out set, then run the rounds (traffic with feedback → learning → gate → publication
or rejection → held-out accuracy of whatever serves), and write the report.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from reef.cli.quickstart.application import TriageApp
from reef.cli.quickstart.errors import QuickstartError
from reef.cli.quickstart.report import Run, plural, print_summary, round_line, write_reports
from reef.cli.quickstart.rounds import RoundResult, Rounds
from reef.cli.quickstart.scenario import LABELS, Ticket, TicketGenerator
from reef.cli.quickstart.stack import Stack
from reef.cli.quickstart.workspace import SCENARIO, Workspace, prepare, write_config

# Optimizer steps per round: enough for SmolLM2 to learn the six labels from one round
# of corrections; the tiny random model only has to show the loop working.
TRAIN_STEPS = {"smollm2-135m": 40, "tiny-random": 8}


@dataclass(frozen=True)
class Options:
    """The command line, checked."""

    directory: Path
    rounds: int
    requests: int
    model: str
    heldout: int
    port: int
    seed: int
    fresh: bool
    demos: int = 0
    feedback: str = "explicit"


# The operator's labelled suite that gates candidates under implicit feedback (computed
# feedback trains but is never the gate's evidence): tickets in held-out phrasings,
# drawn apart from the held-out set the report measures.
SUITE_SIZE = 36


def run_quickstart(options: Options) -> None:
    """Everything ``reef quickstart`` does (module docstring). Raises ``QuickstartError``
    with what to do when something is missing or fails."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded
    started = time.monotonic()
    workspace = prepare(options.directory, options.fresh)
    handler = _log_to(workspace.logs / "reef.log")
    try:
        _run(options, workspace, started)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def _run(options: Options, workspace: Workspace, started: float) -> None:
    console = Console(highlight=False)
    generator = TicketGenerator(options.seed)
    heldout = generator.draw(options.heldout, held_out=True)
    implicit = options.feedback == "implicit"
    suite = generator.draw(SUITE_SIZE, held_out=True) if implicit else None
    traffic = [generator.draw(options.requests, held_out=False) for _ in range(options.rounds)]
    port = options.port or _free_port()
    settings = write_config(
        workspace, options.model, port, TRAIN_STEPS[options.model], heldout, options.demos, suite
    )
    run = Run(
        options.model, options.rounds, options.requests, options.heldout, options.seed, load=_load()
    )
    run.feedback = options.feedback
    console.print(
        f"[bold]Reef quickstart[/bold] in {workspace.root}: triage of support tickets into "
        f"{len(LABELS)} labels ({', '.join(LABELS)}) on {options.model}; "
        f"{plural(options.rounds, 'round')} of {options.requests} tickets; held-out set of "
        f"{options.heldout} tickets in phrasings the traffic never uses."
    )
    with Stack(settings, workspace.logs / "engine.log") as stack:
        try:
            _start(stack, console, options.model)
            run.startup_seconds = time.monotonic() - started
            app = TriageApp(stack.url, SCENARIO)
            try:
                rounds = Rounds(stack, app, SCENARIO, console, implicit=implicit, seed=options.seed)
                _rounds(rounds, run, heldout, traffic)
            finally:
                app.close()
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: stopping the learning job and the servers[/]")
            _cancel_jobs(stack)
            raise
        except QuickstartError as error:
            raise QuickstartError(f"{error.message}\n(logs: {workspace.logs})") from error
    run.seconds = time.monotonic() - started
    write_reports(run, workspace)
    print_summary(console, run, workspace)


def _start(stack: Stack, console: Console, model: str) -> None:
    first = model == "smollm2-135m" and not (stack.settings.home / "models" / model).exists()
    note = " (first start: converting SmolLM2 to safetensors, ~20 s)" if first else ""
    with console.status(f"starting the embedded engine{note}"):
        ready = stack.start_engine()
    console.print(f"engine: {ready.model} at {ready.base_url}")
    with console.status("starting the gateway and the learning worker"):
        stack.start_gateway()
        stack.start_worker()
    console.print(f"gateway: {stack.url}/v1 (OpenAI-compatible), scenario {SCENARIO!r}")


def _rounds(rounds: Rounds, run: Run, heldout: list[Ticket], traffic: list[list[Ticket]]) -> None:
    run.base = rounds.measure("base", heldout)
    rounds.console.print(
        f"[bold]Base release[/bold] (seq {run.base.seq}): held-out accuracy "
        f"[bold]{run.base.accuracy:.0%}[/bold] ({run.base.correct}/{run.base.total})"
    )
    serving = run.base
    for number, batch in enumerate(traffic, start=1):
        result = RoundResult(number)
        rounds.traffic(result, batch)
        rounds.learn(result)
        rounds.read_signals(result)
        if result.published_release_id is not None:
            rounds.wait_serving(result.published_release_id)
            serving = rounds.measure(f"round {number}", heldout)
        result.heldout = serving
        run.rounds.append(result)
        rounds.console.print(round_line(result))


def _cancel_jobs(stack: Stack) -> None:
    if stack.database is None:
        return
    queue = stack.jobs()
    for job in queue.list(scenario=SCENARIO):
        if job.state in ("queued", "running"):
            queue.cancel(job.id)


def _log_to(path: Path) -> logging.Handler:
    """Reef's own log lines go to a file: the console shows progress."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    for chatty in ("httpx", "httpx2", "openai"):  # a line per request
        logging.getLogger(chatty).setLevel(logging.WARNING)
    return handler


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} CPUs)"


__all__ = ["Options", "run_quickstart"]

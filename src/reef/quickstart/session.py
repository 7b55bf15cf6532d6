"""What ``reef quickstart`` does, once its options are checked.

Reads top to bottom: check what is installed, prepare the directory and its
configuration, start the engine, gateway and worker, measure the first release on the
held-out set, then run the rounds (traffic with feedback → learning → gate → publication
or rejection → held-out accuracy of whatever serves), and write the report.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import socket
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from reef.config import ReefSettings
from reef.quickstart.agent import TOOLS, RequestGenerator, suite_items
from reef.quickstart.agent_app import AgentApp
from reef.quickstart.application import App, TriageApp
from reef.quickstart.errors import QuickstartError
from reef.quickstart.report import Run, plural, print_summary, round_line, write_reports
from reef.quickstart.rounds import RoundResult, Rounds
from reef.quickstart.scenario import LABELS, TicketGenerator
from reef.quickstart.stack import Stack
from reef.quickstart.workspace import (
    AGENT_SCENARIO,
    SCENARIO,
    Workspace,
    prepare,
    training_threads,
    write_agent_config,
    write_config,
)

# Passes over each round's training examples: on SmolLM2 two passes learn the six
# labels from one round of corrections (docs/benchmarks.md); the tiny random model only
# has to show the loop working.
TRAIN_EPOCHS = {"smollm2-135m": 2.0, "tiny-random": 2.0}
# The agent task's: two passes over a round's 120 examples (docs/benchmarks.md).
AGENT_TRAIN_EPOCHS = {"smollm2-135m": 2.0, "tiny-random": 2.0}
# The port the docs name (the ``server.port`` default): the README's snippet works
# against the quickstart's folder as it is whenever that port is free.
DEFAULT_PORT = 8600

# The agent's gate suite: requests in held-out phrasings, none in the report's held-out
# set; two items each (the call, the answer).
AGENT_SUITE_SIZE = 18


@dataclass(frozen=True)
class Options:
    """The command line, checked."""

    directory: Path
    rounds: int
    requests: int
    model: str
    heldout: int
    port: int | None
    seed: int
    fresh: bool
    demos: int = 0
    feedback: str = "explicit"
    task: str = "triage"
    dtype: str = "float32"


@dataclass(frozen=True)
class Plan:
    """What one task brings to the run: its scenario, configuration, held-out set and
    traffic, the line that introduces it, and its application."""

    scenario: str
    settings: ReefSettings
    heldout: Sequence[object]
    traffic: list[Sequence[object]]
    intro: str
    application: Callable[[str], App]


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


def _triage_plan(options: Options, workspace: Workspace, port: int) -> Plan:
    generator = TicketGenerator(options.seed)
    heldout = generator.draw(options.heldout, held_out=True)
    implicit = options.feedback == "implicit"
    suite = generator.draw(SUITE_SIZE, held_out=True) if implicit else None
    traffic = [generator.draw(options.requests, held_out=False) for _ in range(options.rounds)]
    settings = write_config(
        workspace,
        options.model,
        port,
        TRAIN_EPOCHS[options.model],
        heldout,
        options.demos,
        suite,
        dtype=options.dtype,
        threads=training_threads(),
    )
    intro = (
        f"triage of support tickets into {len(LABELS)} labels ({', '.join(LABELS)}) on "
        f"{options.model}; {plural(options.rounds, 'round')} of {options.requests} tickets; "
        f"held-out set of {options.heldout} tickets in phrasings the traffic never uses."
    )
    return Plan(SCENARIO, settings, heldout, list(traffic), intro, _triage_app)


def _triage_app(url: str) -> App:
    return TriageApp(url, SCENARIO)


def _agent_plan(options: Options, workspace: Workspace, port: int) -> Plan:
    generator = RequestGenerator(options.seed)
    heldout = generator.draw(options.heldout, held_out=True)
    suite = generator.draw(AGENT_SUITE_SIZE, held_out=True)
    traffic = [generator.draw(options.requests, held_out=False) for _ in range(options.rounds)]
    world = generator.world
    shown = [
        {"id": f"heldout-{i}", "input": r.text, "reference": {"tool_calls": [r.call.to_openai()]},
         "fact": r.fact, "answer": r.answer}
        for i, r in enumerate(heldout)
    ]  # fmt: skip
    settings = write_agent_config(
        workspace,
        options.model,
        port,
        AGENT_TRAIN_EPOCHS[options.model],
        shown,
        suite_items(suite, world, "suite"),
        dtype=options.dtype,
        threads=training_threads(),
    )
    intro = (
        f"an order-support agent with {len(TOOLS)} tools "
        f"({', '.join(t['function']['name'] for t in TOOLS)}) on {options.model}; "
        f"{plural(options.rounds, 'round')} of {options.requests} episodes, each graded by "
        f"its outcome; held-out set of {options.heldout} episodes in phrasings and orders "
        "the traffic never uses."
    )

    def application(url: str) -> App:
        return AgentApp(url, AGENT_SCENARIO, world)

    return Plan(AGENT_SCENARIO, settings, heldout, list(traffic), intro, application)


def _run(options: Options, workspace: Workspace, started: float) -> None:
    console = Console(highlight=False)
    port, port_note = choose_port(options.port)
    if port_note:
        console.print(port_note)
    if options.task == "distill":
        from reef.quickstart.distill import run_distill

        run_distill(options, workspace, console, port, started)
        return
    agent = options.task == "agent"
    plan = (_agent_plan if agent else _triage_plan)(options, workspace, port)
    implicit = options.feedback == "implicit"
    run = Run(
        options.model, options.rounds, options.requests, options.heldout, options.seed, load=_load()
    )
    run.feedback = options.feedback
    run.task = options.task
    console.print(f"[bold]Reef quickstart[/bold] in {workspace.root}: {plan.intro}")
    with Stack(plan.settings, workspace.logs / "engine.log") as stack:
        try:
            run.backend, run.dtype = _start(stack, console, options.model, plan.scenario)
            run.startup_seconds = time.monotonic() - started
            app = plan.application(stack.url)
            try:
                rounds = Rounds(
                    stack,
                    app,
                    plan.scenario,
                    console,
                    implicit=implicit,
                    seed=options.seed,
                    metric=run.words.metric,
                )
                _rounds(rounds, run, plan.heldout, plan.traffic)
            finally:
                app.close()
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: stopping the learning job and the servers[/]")
            _cancel_jobs(stack, plan.scenario)
            raise
        except QuickstartError as error:
            raise QuickstartError(f"{error.message}\n(logs: {workspace.logs})") from error
    run.seconds = time.monotonic() - started
    run.cpu_seconds = _cpu_seconds()
    write_reports(run, workspace)
    print_summary(console, run, workspace, port)


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (the engine, stopped by
    now, and every training process), user and system."""
    mine = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def _start(stack: Stack, console: Console, model: str, scenario: str) -> tuple[str, str]:
    """Start the engine, the gateway and the worker; return the backend and the
    precision the engine serves in (its ``GET /health``)."""
    first = model == "smollm2-135m" and not (stack.settings.home / "models" / model).exists()
    note = " (first start: converting SmolLM2 to safetensors, a few seconds)" if first else ""
    with console.status(f"starting the embedded engine{note}"):
        ready = stack.start_engine()
    backend, dtype = _engine_health(ready.base_url)
    console.print(f"engine: {ready.model} ({backend}, {dtype}) at {ready.base_url}")
    with console.status("starting the gateway and the learning worker"):
        stack.start_gateway()
        stack.start_worker()
    console.print(f"gateway: {stack.url}/v1 (OpenAI-compatible), scenario {scenario!r}")
    return backend, dtype


def _engine_health(base_url: str) -> tuple[str, str]:
    """The backend and precision the engine at ``base_url`` reports (``backend: auto``
    resolved); ``unknown`` for what it does not say."""
    try:
        url = base_url.removesuffix("/v1") + "/health"
        with urllib.request.urlopen(url, timeout=10) as reply:  # noqa: S310 (the engine we started: http)
            health = json.load(reply)
    except (OSError, ValueError):
        return "unknown", "unknown"
    return str(health.get("backend", "unknown")), str(health.get("dtype", "unknown"))


def _rounds(
    rounds: Rounds, run: Run, heldout: Sequence[object], traffic: list[Sequence[object]]
) -> None:
    run.base = rounds.measure("base", heldout)
    rounds.console.print(
        f"[bold]Base release[/bold] (seq {run.base.seq}): held-out {run.words.metric} "
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
        rounds.console.print(round_line(result, run.words))


def _cancel_jobs(stack: Stack, scenario: str) -> None:
    if stack.database is None:
        return
    queue = stack.jobs()
    for job in queue.list(scenario=scenario):
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


def choose_port(asked: int | None, default: int = DEFAULT_PORT) -> tuple[int, str]:
    """The gateway's port for the run and for ``reef serve`` in the folder afterwards,
    and a line to print when it is not the one the docs name: ``asked`` when given (0:
    a free one), else ``default`` (the docs' 8600) when it is free on 127.0.0.1, else a
    free one."""
    if asked:
        return asked, ""
    if asked == 0:
        return _free_port(), ""
    if _is_free(default):
        return default, ""
    port = _free_port()
    return port, (
        f"port {default} is taken: the gateway runs on {port}, and the folder's reef.yaml "
        f"serves on {port} (use http://127.0.0.1:{port}/v1 where the docs say {default})"
    )


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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

"""``reef worker``, ``reef learn`` and ``reef jobs list|show|cancel``.

Mount in ``reef.cli.main``::

    app.command("worker")(worker_command)
    app.command("learn")(learn_command)
    app.add_typer(jobs_app, name="jobs")

Heavy imports happen inside the commands so ``reef --help`` stays fast.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from reef.core.errors import InvalidInputError

if TYPE_CHECKING:
    from reef.jobs import Job, JobQueue

jobs_app = typer.Typer(help="Learning jobs: list, show, cancel.", no_args_is_help=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./reef.yaml if present)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@contextmanager
def _open_queue(
    config: Path | None, create: bool = False, scenario: str | None = None
) -> Iterator[JobQueue]:
    """The job queue of the configured store; without ``create``, the store must exist
    (``StoreNotFoundError`` otherwise); with ``scenario``, ``UnknownScenarioError``
    unless it is configured or in the store."""
    from reef.cli.stores import check_scenario, open_existing_database
    from reef.config import load_settings
    from reef.db import open_database
    from reef.jobs import JobQueue

    settings = load_settings(config)
    database = open_database(settings.store_url()) if create else open_existing_database(settings)
    try:
        if scenario is not None:
            check_scenario(settings, database, scenario)
        yield JobQueue(database)
    finally:
        database.close()


def _parse_urls(pairs: list[str]) -> dict[str, str]:
    urls = {}
    for pair in pairs:
        name, sep, url = pair.partition("=")
        if not sep or not name or not url:
            raise InvalidInputError(f"--upstream-url wants NAME=URL, got {pair!r}")
        urls[name] = url
    return urls


def worker_command(
    config: ConfigOption = None,
    max_concurrent: Annotated[int, typer.Option(help="Jobs run at once.")] = 1,
    lease_seconds: Annotated[
        float,
        typer.Option(
            help="Lease length; another worker retries a job this long after "
            "its worker stopped heartbeating."
        ),
    ] = 60.0,
    poll_seconds: Annotated[float, typer.Option(help="Pause between passes.")] = 1.0,
    upstream_url: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=BASE_URL for an upstream without a base_url (e.g. a `local` "
            "engine started elsewhere), used by reflective learners. Repeatable."
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Run a learning worker: fire recipe triggers, claim jobs, propose candidates.

    Every scenario's recipe, with the suites, environments and upstreams it names, is
    checked first: a problem stops it with exit code 2, one line per problem.
    """
    from reef.cli.preflight import check_scenarios
    from reef.cli.serving import guard_tools
    from reef.cli.stores import build_worker
    from reef.config import load_settings
    from reef.db import open_database
    from reef.experience import SQLExperienceStore

    logging.basicConfig(
        level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    settings = load_settings(config)
    check_scenarios(settings, serving=False, learning=True)
    settings.home.mkdir(parents=True, exist_ok=True)
    guard_tools(settings)
    database = open_database(settings.store_url())
    store = SQLExperienceStore(database)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        worker = build_worker(
            settings,
            database,
            store,
            max_concurrent=max_concurrent,
            lease_seconds=lease_seconds,
            poll_seconds=poll_seconds,
            upstream_base_urls=_parse_urls(upstream_url or []),
        )
        worker.run_forever(stop)
    finally:
        store.close()
        database.close()


def learn_command(
    scenario: Annotated[str, typer.Option(help="Scenario to learn.")],
    recipe: Annotated[
        Path | None,
        typer.Option(help="Recipe file for this job (default: the scenario's configured one)."),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Enqueue a manual learning job and print its id (a worker runs it). Refused (exit
    2, nothing queued, no store created) for a scenario without a recipe, unless
    --recipe gives one."""
    from reef.config import load_settings
    from reef.jobs import NoRecipeError
    from reef.learning import load_recipe

    job_input: dict[str, object] = {"trigger": "manual"}
    if recipe is not None:
        job_input["recipe"] = load_recipe(recipe).model_dump(mode="json", exclude_none=True)
    elif load_settings(config).scenario(scenario).recipe is None:
        raise NoRecipeError(scenario, ", or pass --recipe FILE")
    with _open_queue(config, create=True, scenario=scenario) as queue:
        job = queue.enqueue(scenario, "learn", job_input)
    if job.input != job_input:
        typer.echo(f"scenario {scenario!r} already has a {job.state} job:", err=True)
    typer.echo(job.id)


@jobs_app.command("list")
def jobs_list(
    scenario: Annotated[str | None, typer.Option(help="Only this scenario.")] = None,
    state: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """List learning jobs, newest first."""
    with _open_queue(config, scenario=scenario) as queue:
        jobs = queue.list(scenario=scenario, state=state, limit=limit)
    if as_json:
        typer.echo(json.dumps([job.as_dict() for job in jobs], indent=2))
        return
    _print_table(jobs)


def _print_table(jobs: list[Job]) -> None:
    from rich.console import Console
    from rich.table import Table

    from reef.cli.status import job_cost

    names = ("id", "scenario", "state", "attempt", "progress", "message", "candidate", "cost")
    table = Table(*names)
    for job in jobs:
        progress = "" if job.progress is None else f"{job.progress:.0%}"
        table.add_row(
            job.id,
            job.scenario,
            job.state,
            str(job.attempt),
            progress,
            job.error or job.message or "",
            job.candidate_id or "",
            job_cost(job.result),
        )
    Console(width=200).print(table)


@jobs_app.command("show")
def jobs_show(
    job_id: Annotated[str, typer.Argument(help="Job id.")], config: ConfigOption = None
) -> None:
    """Print one job as JSON: state, progress, logs, metrics, result."""
    with _open_queue(config) as queue:
        job = queue.get(job_id)
    typer.echo(json.dumps(job.as_dict(), indent=2))


@jobs_app.command("cancel")
def jobs_cancel(
    job_id: Annotated[str, typer.Argument(help="Job id.")], config: ConfigOption = None
) -> None:
    """Cancel a queued or running job (its worker stops at its next heartbeat)."""
    with _open_queue(config) as queue:
        job = queue.cancel(job_id)
    typer.echo(f"job {job.id} is {job.state}")

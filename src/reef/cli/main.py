"""``reef`` commands."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from reef.cli.costs import costs_command
from reef.cli.engine import engine_app
from reef.cli.evaluation import eval_app
from reef.cli.exits import run
from reef.cli.feedback import feedback_app
from reef.cli.harness import harness_app
from reef.cli.help_text import unwrap_help
from reef.cli.importing import import_command
from reef.cli.learning import jobs_app, learn_command, worker_command
from reef.cli.quickstart import quickstart_command
from reef.cli.releases import releases_app
from reef.cli.signals import signals_app
from reef.cli.status import status_command
from reef.config import ReefSettings, load_settings, masked_dump
from reef.core.errors import InvalidInputError
from reef.core.third_party import filter_third_party_warnings

app = typer.Typer(
    name="reef",
    help="Reef: an OpenAI/Anthropic-compatible gateway that turns traffic into better agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(engine_app, name="engine")
app.add_typer(releases_app, name="releases")
app.add_typer(harness_app, name="harness")
app.add_typer(jobs_app, name="jobs")
app.add_typer(eval_app, name="eval")
app.add_typer(feedback_app, name="feedback")
app.add_typer(signals_app, name="signals")
app.command("worker")(worker_command)
app.command("learn")(learn_command)
app.command("quickstart")(quickstart_command)
app.command("status")(status_command)
app.command("import")(import_command)
app.command("costs")(costs_command)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./reef.yaml if present)."),
]

log = logging.getLogger("reef")


def _settings(config: Path | None, **overrides: Any) -> ReefSettings:
    return load_settings(config, **{k: v for k, v in overrides.items() if v is not None})


def _setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Bind address (overrides server.host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (overrides server.port).")] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="Gateway processes sharing the port (overrides server.workers)."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
    worker: Annotated[
        bool, typer.Option(help="Also run a learning worker in this process.")
    ] = True,
) -> None:
    """Run the gateway, a learning worker and, for the `local` upstream, the engine.

    Every scenario's initial harness and (with the worker) recipe, with the suites,
    environments and upstreams it names, are checked first: a problem stops it with
    exit code 2, one line per problem naming the setting.
    """
    from reef.cli.preflight import check_scenarios
    from reef.cli.serving import run_gateway

    _setup_logging(log_level)
    settings = _settings(config)
    check_scenarios(settings, serving=True, learning=worker)
    server_overrides: dict[str, Any] = {}
    if host is not None:
        server_overrides["host"] = host
    if port is not None:
        server_overrides["port"] = port
    if workers is not None:
        server_overrides["workers"] = workers
    if server_overrides:
        settings = settings.model_copy(
            update={"server": settings.server.model_copy(update=server_overrides)}
        )
    run_gateway(settings, with_worker=worker, log_level=log_level)


@config_app.command("show")
def config_show(config: ConfigOption = None) -> None:
    """Print the merged configuration (file + REEF_* env + defaults), secrets masked."""
    settings = _settings(config)
    typer.echo(json.dumps(masked_dump(settings), indent=2, default=str))


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON schema of reef.yaml."""
    typer.echo(json.dumps(ReefSettings.model_json_schema(), indent=2))


@app.command()
def export(
    scenario: Annotated[str, typer.Option(help="Scenario to export.")],
    format: Annotated[
        str,
        typer.Option(
            "--format", "-f", help="jsonl (also named reef), parquet, openai-finetune or otel."
        ),
    ] = "jsonl",
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="File to write (default: stdout; parquet needs one)."),
    ] = None,
    capture_content: Annotated[
        bool,
        typer.Option(
            "--capture-content/--no-capture-content",
            help="otel: write message content and corrections (needed to import it back).",
        ),
    ] = True,
    config: ConfigOption = None,
) -> None:
    """Export a scenario's records with their feedback, redacted.

    Feedback is joined to each record; text is redacted with the configured
    capture.redact_patterns. openai-finetune writes one conversation per answer, a
    correction replacing the served answer; otel writes OTLP/JSON GenAI spans (one
    ExportTraceServiceRequest per line, as the Collector's file exporter), content
    included unless --no-capture-content; reef import reads jsonl and otel back."""
    from reef.cli.stores import check_scenario, open_existing_database
    from reef.experience import EXPORT_FORMATS, Redactor, SQLExperienceStore, export_records
    from reef.telemetry.otlp_json import OtelFileOptions, export_otel

    formats = (*EXPORT_FORMATS, "otel")
    if format not in formats:
        raise InvalidInputError(
            f"--format must be one of {', '.join(formats[:-1])} or {formats[-1]}, not {format!r}"
        )
    if format == "parquet" and output is None:
        raise InvalidInputError("parquet export needs --output FILE")
    settings = _settings(config)
    redactor = Redactor(settings.capture.redact_patterns)
    database = open_existing_database(settings)
    store = SQLExperienceStore(database)
    try:
        check_scenario(settings, database, scenario)
        out = sys.stdout.buffer if output is None else output
        if format == "otel":
            options = OtelFileOptions(capture_content, settings.otel.service_name)
            count = export_otel(store, scenario, out, options, redactor=redactor)
        else:
            count = export_records(store, scenario, format, out, redactor=redactor)  # type: ignore[arg-type]
    finally:
        store.close()
        database.close()
    typer.echo(f"exported {count} records of scenario {scenario!r}", err=True)


@app.command()
def migrate(
    config: ConfigOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the revisions it would apply; apply none.")
    ] = False,
) -> None:
    """Create or upgrade the store's schema (a SQLite store is copied first)."""
    from reef.cli.stores import describe_pending, migrate_store

    settings = _settings(config)
    typer.echo(describe_pending(settings) if dry_run else migrate_store(settings))


@app.command()
def gc(
    yes: Annotated[bool, typer.Option("--yes", help="Delete; without it, only list.")] = False,
    min_age_seconds: Annotated[
        int, typer.Option(help="Keep artifacts younger than this (a candidate may be forming).")
    ] = 3600,
    config: ConfigOption = None,
) -> None:
    """Remove artifacts that no release and no live candidate references."""
    from reef.cli.stores import open_existing_database
    from reef.releases import ReleaseChain, collect_garbage, open_artifact_store

    settings = _settings(config)
    # Never a fresh store: with no release to keep, every artifact would look unreachable.
    database = open_existing_database(settings)
    try:
        reachable = ReleaseChain(database).reachable_artifacts()
    finally:
        database.close()
    artifacts = open_artifact_store(settings.artifacts_url())
    removed = collect_garbage(
        artifacts, reachable, dry_run=not yes, min_age_seconds=min_age_seconds
    )
    verb = "removed" if yes else "would remove (run with --yes to delete)"
    typer.echo(f"{verb} {len(removed)} unreachable artifacts; {len(reachable)} kept reachable")
    for digest in removed:
        typer.echo(f"  {digest}")


# Last, once every command above is registered.
unwrap_help(app)


def main() -> None:
    """Entry point of the ``reef`` command: errors become a message and an exit code
    (``reef.cli.exits``); third-party deprecation notices are hidden
    (``reef.core.third_party``)."""
    filter_third_party_warnings()
    run(app)

"""``reef import``: bring history from other tools' logs (or another Reef) into a scenario.

Heavy imports happen inside the command so ``reef --help`` stays fast.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from reef.experience import ImportSummary

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./reef.yaml if present)."),
]


def import_command(
    paths: Annotated[list[Path], typer.Argument(help="JSON Lines files to import.")],
    scenario: Annotated[str, typer.Option(help="Scenario the records join.")],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="auto, reef, otel, openai-chat, openai-finetune, langfuse, langsmith or "
            "tensorzero (auto: sniffed).",
        ),
    ] = "auto",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Read and check every line; write nothing.")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Stop at the first malformed line (exit 2).")
    ] = False,
    demo_trust: Annotated[
        str,
        typer.Option(help="Trust level of imported demonstrations and feedback."),
    ] = "operator",
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    config: ConfigOption = None,
) -> None:
    """Import records and feedback from JSON Lines files into SCENARIO.

    Idempotent (a second import adds nothing) and resumable (an interrupted import,
    rerun, continues from its checkpoint under <home>/imports). Text is redacted with
    capture.redact_patterns before it is stored. Malformed lines are skipped and listed
    unless --strict. Formats and their field mappings: docs/import-export.md."""
    from rich.console import Console

    from reef.config import load_settings
    from reef.experience import (
        IMPORT_FORMATS,
        ImportOptions,
        ImportSummary,
        Redactor,
        SQLExperienceStore,
        UnknownImportFormatError,
    )
    from reef.experience import demo_trust as parse_demo_trust
    from reef.gateway.requests import check_scenario_name

    # The name traffic would use: an imported scenario must be one a client can reach.
    check_scenario_name(scenario)
    if format != "auto" and format not in IMPORT_FORMATS:
        raise UnknownImportFormatError(
            f"unknown import format {format!r}; use auto or one of {', '.join(IMPORT_FORMATS)}"
        )
    for path in paths:
        if not path.is_file():
            raise typer.BadParameter(f"{path} is not a file", param_hint="PATHS")
    settings = load_settings(config)
    options = ImportOptions(
        scenario=scenario,
        fmt=format,
        dry_run=dry_run,
        strict=strict,
        demo_trust=parse_demo_trust(demo_trust),
        redactor=Redactor(settings.capture.redact_patterns),
        checkpoint_dir=settings.home / "imports",
    )
    summary = ImportSummary()
    console = Console(stderr=True)
    store = None if dry_run else SQLExperienceStore.from_url(settings.store_url(), migrate=True)
    try:
        for path in paths:
            _import_one(store, path, options, summary, console)
    finally:
        if store is not None:
            store.close()
    if as_json:
        typer.echo(json.dumps({"dry_run": dry_run, **summary.as_dict()}, indent=2))
    else:
        _print_summary(summary, scenario, dry_run)


def _import_one(
    store: object,
    path: Path,
    options: object,
    summary: ImportSummary,
    console: Console,
) -> None:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from reef.experience import import_file

    started = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(path.name, total=path.stat().st_size, rate="")
        first = summary.records

        def report(done: int, current: ImportSummary) -> None:
            elapsed = max(time.perf_counter() - started, 1e-6)
            rate = (current.records - first) / elapsed
            bar.update(task, completed=done, rate=f"{rate:,.0f} records/s")

        import_file(store, path, options, summary, report)  # type: ignore[arg-type]


def _print_summary(summary: ImportSummary, scenario: str, dry_run: bool) -> None:
    verb = "would import" if dry_run else "imported"
    lines = [
        f"{verb} into {scenario!r}: {summary.records} records, {summary.feedback} feedback, "
        f"{summary.sessions} sessions formed; {summary.duplicate_records} records and "
        f"{summary.duplicate_feedback} feedback already there; {summary.skipped} lines "
        f"skipped ({summary.lines} read)"
    ]
    lines += [f"{path}: resumed after line {line}" for path, line in summary.resumed.items()]
    lines += [f"  skipped {path}:{line}: {reason}" for path, line, reason in summary.skips]
    if summary.skipped > len(summary.skips):
        lines.append(f"  ... and {summary.skipped - len(summary.skips)} more")
    typer.echo("\n".join(lines), err=True)

"""``reef feedback calibrate``: how far computed feedback agrees with posted feedback.

Heavy imports happen inside the command so ``reef --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from reef.experience import SourceCalibration

feedback_app = typer.Typer(help="Feedback: calibrate computed sources.", no_args_is_help=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./reef.yaml if present)."),
]


@feedback_app.command("calibrate")
def feedback_calibrate(
    scenario: Annotated[str, typer.Option(help="The scenario to measure.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    config: ConfigOption = None,
) -> None:
    """Measure each computed feedback source (signal:*, judge:*) against the feedback
    people posted on the same answers: precision, recall, corrections that agree."""
    from reef.cli.stores import check_scenario, open_existing_database
    from reef.config import load_settings
    from reef.experience import SQLExperienceStore, calibrate

    settings = load_settings(config)
    database = open_existing_database(settings)
    try:
        check_scenario(settings, database, scenario)
        found = calibrate(SQLExperienceStore(database), scenario)
    finally:
        database.close()
    if as_json:
        typer.echo(json.dumps([source.as_dict() for source in found], indent=2))
        return
    if not found:
        typer.echo(f"scenario {scenario!r} has no computed feedback yet")
        return
    _print_table(found)


def _print_table(found: list[SourceCalibration]) -> None:
    from rich.console import Console
    from rich.table import Table

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    table = Table(
        "source", "rows", "graded both ways", "says", "precision", "recall", "corrections agree"
    )
    for source in found:
        table.add_row(
            source.source,
            str(source.rows),
            str(source.compared),
            source.polarity,
            share(source.precision),
            share(source.recall),
            f"{share(source.corrections_agree)} of {source.corrections_compared}",
        )
    Console(width=160).print(table)

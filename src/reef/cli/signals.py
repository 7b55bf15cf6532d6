"""``reef signals preview``: run the conversation-signal rules over recent traffic and
print what they find, writing nothing (``reef.learning.signals_preview``).

Heavy imports happen inside the command so ``reef --help`` stays fast.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from reef.core.clock import since_time
from reef.core.errors import InvalidInputError

if TYPE_CHECKING:
    from reef.config import ReefSettings
    from reef.learning import SignalPreview, SignalsConfig

signals_app = typer.Typer(
    help="Conversation signals: preview the rules on recent traffic.", no_args_is_help=True
)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./reef.yaml if present)."),
]


def parse_since(value: str, now: datetime) -> datetime:
    """``value`` as a time: an age (``30m``, ``24h``, ``7d``) before ``now``, or an ISO
    8601 time (UTC when it names no zone). Raises ``typer.BadParameter`` otherwise."""
    try:
        return since_time(value, now)
    except InvalidInputError as exc:
        raise typer.BadParameter(str(exc), param_hint="--since") from None


@signals_app.command("preview")
def signals_preview(
    scenario: Annotated[str, typer.Option(help="The scenario whose traffic to read.")],
    since: Annotated[
        str | None,
        typer.Option(
            help="Read sessions active since then: an age (30m, 24h, 7d) or an ISO 8601 "
            "time. Default: the rules' lookback_hours (24h)."
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, help="At most this many sessions, the most recent first.")
    ] = 500,
    sample: Annotated[int, typer.Option(min=0, help="Examples shown of each kind.")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    config: ConfigOption = None,
) -> None:
    """Run the scenario's signal rules (its recipe's `signals`, else the defaults) over
    recent traffic and print counts per signal, extracted corrections, complaints
    without a value, and a sample of each; with `signals.extractor` in the recipe, also
    what the extractor's model would add (it is called; nothing is written). Writes
    nothing; never creates a store."""
    from reef.cli.stores import check_scenario, open_existing_database
    from reef.config import load_settings
    from reef.experience import SQLExperienceStore
    from reef.learning import UpstreamModels, preview_signals

    settings = load_settings(config)
    rules, origin = _rules(settings, scenario)
    now = datetime.now(UTC)
    start = (
        parse_since(since, now)
        if since is not None
        else now - timedelta(hours=rules.lookback_hours)
    )
    database = open_existing_database(settings)
    try:
        check_scenario(settings, database, scenario)
        store = SQLExperienceStore(database)
        # the extractor's dry run calls the model it names, as the worker would
        models = UpstreamModels(settings, scenario) if rules.extractor is not None else None
        found = preview_signals(
            store, scenario, rules, start, limit, now=now, sample=sample, models=models
        )
    finally:
        database.close()
    if as_json:
        typer.echo(json.dumps({**found.as_dict(), "rules": origin}, indent=2))
        return
    _print(found, origin)


def _rules(settings: ReefSettings, scenario: str) -> tuple[SignalsConfig, str]:
    """The scenario's recipe's signal rules when it enables any, else the defaults; and
    which of the two, in words."""
    from reef.learning import SignalsConfig, load_recipe

    path = settings.scenarios[scenario].recipe if scenario in settings.scenarios else None
    if path is not None:
        recipe = load_recipe(path)
        if recipe.signals.enabled:
            return recipe.signals, f"recipe {path}"
    return SignalsConfig(), "the default rules (the scenario's recipe enables none)"


def _print(found: SignalPreview, origin: str) -> None:
    echo = typer.echo
    echo(
        f"scenario {found.scenario!r}: {found.sessions} sessions since "
        f"{found.since:%Y-%m-%d %H:%M:%S} UTC, {found.answers} answers; rules: {origin}"
    )
    if not found.by_signal:
        echo("no signals found")
        return
    echo("signals:")
    for name, count in sorted(found.by_signal.items()):
        echo(f"  {name:<12} {count}")
    echo(f"corrections with a value:   {found.corrections}")
    echo(
        f"complaints without a value: {found.complaints_without_value}"
        + (
            "  (score 0, but nothing to train on or evaluate against)"
            if found.complaints_without_value
            else ""
        )
    )
    if found.extractor_calls or found.extractor_error:
        echo(
            f"extractor (dry run): {found.extractor_calls} calls, "
            f"{found.extracted} values it would add"
            + (f"; stopped: {found.extractor_error}" if found.extractor_error else "")
        )
    for kind, rows in found.samples.items():
        echo(f"\n{kind} (sample):")
        for row in rows:
            echo(f"  record {row['record_id']}")
            if row["answer"] is not None:
                echo(f"    answer: {_line(row['answer'])}")
            echo(f"    said:   {_line(row['said'])}")
            if row["correction"] is not None:
                echo(f"    correction: {_line(row['correction'])}")


def _line(text: str) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= 160 else flat[:157] + "..."

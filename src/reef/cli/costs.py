"""``reef costs``: what the recorded traffic cost, per scenario, key and purpose."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from reef.cli.signals import parse_since

if TYPE_CHECKING:
    from reef.experience import SpendRow

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./reef.yaml if present)."),
]
_HEADER = ("scenario", "key", "purpose", "requests", "unpriced", "input", "cached", "output")


def costs_command(
    since: Annotated[
        str,
        typer.Option(help="Count records since then: an age (30m, 24h, 7d) or an ISO 8601 time."),
    ] = "7d",
    by: Annotated[
        str, typer.Option(help="Group by `key` (the API key) or `release` (what served it).")
    ] = "key",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    config: ConfigOption = None,
) -> None:
    """Print what the recorded exchanges cost since a time, per scenario, key (or
    release) and purpose (from each record's cost: its usage at its model's price;
    unpriced ones counted)."""
    from reef.cli.stores import open_existing_database
    from reef.config import load_settings
    from reef.experience import spend_since

    if by not in ("key", "release"):
        raise typer.BadParameter(f"{by!r} is neither key nor release", param_hint="--by")
    start = parse_since(since, datetime.now(UTC))
    database = open_existing_database(load_settings(config))
    try:
        rows = spend_since(database, start, "release" if by == "release" else "key")
    finally:
        database.close()
    if as_json:
        typer.echo(json.dumps([asdict(row) for row in rows], indent=2))
        return
    typer.echo(format_table(rows, start, by))


def format_table(rows: list[SpendRow], start: datetime, by: str = "key") -> str:
    """The rows as an aligned text table, with a total line."""
    header = [*_HEADER, "cost"]
    header[1] = by
    lines = [header]
    for row in rows:
        lines.append(
            [
                row.scenario,
                (row.key if by == "key" else row.release) or "-",
                row.purpose,
                str(row.requests),
                str(row.unpriced),
                str(row.input_tokens),
                str(row.cached_input_tokens),
                str(row.output_tokens),
                f"{row.cost:.4f}",
            ]
        )
    total = sum(row.cost for row in rows)
    unpriced = sum(row.unpriced for row in rows)
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = [f"spend since {start:%Y-%m-%d %H:%M} UTC"]
    for line in lines:
        out.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    requests = sum(row.requests for row in rows)
    out.append(f"total {total:.4f} over {requests} requests; {unpriced} unpriced")
    return "\n".join(out)

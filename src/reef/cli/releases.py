"""``reef releases``: list, show, roll back, promote and adopt-config on the release chain.

Every command reads the store URL from the configuration (``-c/--config``), prints a
table (or JSON with ``--json``) and records the operator as ``cli:<os user>``. Errors are
``ReefError``s, which ``reef.cli.main`` turns into a message and an exit code. Heavy
imports happen inside the commands so ``reef --help`` stays fast.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.table import Table

    from reef.releases import Candidate, Release, ReleaseChain, ScenarioSummary

releases_app = typer.Typer(
    help="Inspect the release chain; roll back, promote, adopt a configuration change. "
    "The chain decides what serves: a model edited in reef.yaml serves once "
    "'reef releases adopt-config' appends it.",
    no_args_is_help=True,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./reef.yaml if present)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ReasonOption = Annotated[str | None, typer.Option(help="Why; stored with the release.")]
ExpectedHeadOption = Annotated[
    str | None,
    typer.Option(
        "--expected-head",
        help="Fail unless this release is the head (default: the head read just before).",
    ),
]


def cli_actor() -> str:
    """``cli:<os user>``, the actor recorded for operations run from the command line."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no login name, no passwd entry (some containers)
        return "cli:unknown"


@contextmanager
def _open_chain(config: Path | None, scenario: str | None = None) -> Iterator[ReleaseChain]:
    """The release chain of the configured store (which must exist); with ``scenario``,
    ``UnknownScenarioError`` unless it is configured or in the store."""
    from reef.cli.stores import check_scenario, open_existing_database
    from reef.config import load_settings
    from reef.releases import ReleaseChain

    settings = load_settings(config)
    database = open_existing_database(settings)
    try:
        if scenario is not None:
            check_scenario(settings, database, scenario)
        yield ReleaseChain(database)
    finally:
        database.close()


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2))


def print_table(table: Table) -> None:
    """Print a rich table; piped output is wide enough for whole ids."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        # Piped output is for grep and scripts: never squeeze ids into ellipses.
        console = Console(width=max(console.width, 240))
    console.print(table)


def _short(digest: str | None) -> str:
    """``sha256:`` plus 12 hex digits: enough to tell releases apart in a table."""
    return "-" if digest is None else digest[:19]


def _releases_table(title: str, releases: Sequence[Release]) -> Table:
    from rich.table import Table

    table = Table(title=title)
    for name in ("seq", "id", "operation", "base", "adapter", "harness", "by", "when"):
        table.add_column(
            name, no_wrap=name in ("id", "seq"), min_width=36 if name == "id" else None
        )
    table.add_column("reason")
    for release in releases:
        table.add_row(
            str(release.seq),
            release.id,
            release.operation,
            release.manifest.model.base,
            _short(release.manifest.model.adapter),
            _short(release.manifest.harness),
            release.created_by or "-",
            release.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            release.reason or "",
        )
    return table


def _candidates_table(title: str, candidates: Sequence[Candidate]) -> Table:
    from rich.table import Table

    table = Table(title=title)
    for name in ("id", "state", "parent", "adapter", "harness", "by", "updated"):
        table.add_column(name, no_wrap=name == "id", min_width=36 if name == "id" else None)
    table.add_column("reason")
    for candidate in candidates:
        table.add_row(
            candidate.id,
            candidate.state,
            candidate.parent_release_id or "-",
            _short(candidate.manifest.model.adapter),
            _short(candidate.manifest.harness),
            candidate.created_by or "-",
            candidate.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
            candidate.reason or "",
        )
    return table


def _scenarios_table(summaries: Sequence[ScenarioSummary]) -> Table:
    from rich.table import Table

    table = Table(title="scenarios")
    table.add_column("scenario")
    table.add_column("head", no_wrap=True, min_width=36)
    table.add_column("seq")
    table.add_column("releases")
    for summary in summaries:
        table.add_row(
            summary.name,
            summary.head_release_id or "-",
            "-" if summary.head_seq is None else str(summary.head_seq),
            str(summary.releases),
        )
    return table


def _details_table(title: str, fields: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in fields.items():
        shown = value if isinstance(value, str) else json.dumps(value, indent=2)
        table.add_row(name, shown)
    return table


@releases_app.command("list")
def list_releases(
    scenario: Annotated[
        str | None, typer.Option(help="Scenario whose chain to list (default: all scenarios).")
    ] = None,
    candidates: Annotated[
        bool, typer.Option("--candidates", help="List the scenario's candidates instead.")
    ] = False,
    limit: Annotated[int, typer.Option(help="At most this many rows, newest first.")] = 20,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """List scenarios with their heads, or one scenario's releases (or candidates)."""
    from reef.core.errors import InvalidInputError

    with _open_chain(config, scenario) as chain:
        if scenario is None:
            if candidates:
                raise InvalidInputError("--candidates needs --scenario")
            summaries = chain.scenarios()
            if as_json:
                _print_json([summary.as_dict() for summary in summaries])
            else:
                print_table(_scenarios_table(summaries))
        elif candidates:
            found = chain.candidates(scenario, limit=limit)
            if as_json:
                _print_json([candidate.as_dict() for candidate in found])
            else:
                print_table(_candidates_table(f"candidates of {scenario}", found))
        else:
            releases = chain.releases(scenario, limit=limit)
            if as_json:
                _print_json([release.as_dict() for release in releases])
            else:
                print_table(_releases_table(f"releases of {scenario}", releases))


@releases_app.command("show")
def show(
    release_or_candidate: Annotated[str, typer.Argument(metavar="ID", help="Release id.")],
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one release (or candidate) with its manifest, evidence, who and why."""
    from reef.releases import CandidateNotFoundError, ReleaseNotFoundError

    with _open_chain(config) as chain:
        try:
            fields = chain.get_release(release_or_candidate).as_dict()
            kind = "release"
        except ReleaseNotFoundError:
            try:
                fields = chain.get_candidate(release_or_candidate).as_dict()
            except CandidateNotFoundError:
                raise ReleaseNotFoundError(release_or_candidate) from None
            kind = "candidate"
    if as_json:
        _print_json({"kind": kind, **fields})
    else:
        print_table(_details_table(f"{kind} {release_or_candidate}", fields))


def _head_id(chain: ReleaseChain, scenario: str) -> str:
    from reef.releases import ScenarioHasNoReleaseError

    head = chain.head(scenario)
    if head is None:
        raise ScenarioHasNoReleaseError(scenario)
    return head.id


def _print_release(release: Release, as_json: bool) -> None:
    if as_json:
        _print_json(release.as_dict())
    else:
        print_table(_releases_table(f"new head of {release.scenario}", [release]))


@releases_app.command("rollback")
def rollback(
    scenario: Annotated[str, typer.Option(help="Scenario to roll back.")],
    to: Annotated[str, typer.Option("--to", help="Earlier release whose components to restore.")],
    reason: ReasonOption = None,
    expected_head: ExpectedHeadOption = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Append a release equal to an earlier one and make it the head (history is kept)."""
    with _open_chain(config, scenario) as chain:
        expected = expected_head or _head_id(chain, scenario)
        release = chain.rollback(
            scenario, to, expected, cli_actor(), reason or f"rollback to {to} from the CLI"
        )
    _print_release(release, as_json)


@releases_app.command("promote")
def promote(
    candidate: Annotated[str, typer.Argument(help="Id of a passed candidate.")],
    reason: ReasonOption = None,
    expected_head: ExpectedHeadOption = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Publish a candidate that passed evaluation and waits for review."""
    with _open_chain(config) as chain:
        scenario = chain.get_candidate(candidate).scenario
        expected = expected_head or _head_id(chain, scenario)
        release = chain.promote(candidate, expected, cli_actor(), reason or "promoted from the CLI")
    _print_release(release, as_json)


@releases_app.command("adopt-config")
def adopt_config_command(
    scenario: Annotated[str, typer.Option(help="Scenario whose configured model to adopt.")],
    reason: ReasonOption = None,
    expected_head: ExpectedHeadOption = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Append a release serving the model the configuration names now.

    The release chain decides what serves: a scenario's first release takes its model
    from scenarios.<s>.model (else upstreams.<u>.model), and editing it later changes
    nothing until it is adopted here. The new release keeps the head's harness and drops
    an adapter or checkpoint trained on the old base (a rollback brings them back).
    Exits with 2 when the head already serves the configured model.
    """
    from reef.cli.stores import open_existing_database
    from reef.config import load_settings
    from reef.gateway.serving.drift import adopt_config
    from reef.releases import ReleaseChain

    settings = load_settings(config)
    database = open_existing_database(settings)
    try:
        release = adopt_config(
            ReleaseChain(database), settings, scenario, cli_actor(), reason, expected_head
        )
    finally:
        database.close()
    _print_release(release, as_json)

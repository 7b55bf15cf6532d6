"""``reef harness``: install a scenario's evolved harness where an agent runs its own loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

harness_app = typer.Typer(
    name="harness",
    help="Install, roll back and inspect harnesses installed from a Reef gateway.",
    no_args_is_help=True,
)

DirOption = Annotated[Path, typer.Option("--dir", help="Install directory (holds current/).")]


@harness_app.command("install")
def install(
    url: Annotated[str, typer.Option(help="The gateway's base URL, e.g. http://127.0.0.1:8600")],
    scenario: Annotated[str, typer.Option(help="Scenario whose serving harness to install.")],
    dir: DirOption,
    api_key: Annotated[
        str | None, typer.Option(envvar="REEF_API_KEY", help="Key, when the gateway needs one.")
    ] = None,
) -> None:
    """Download, verify the digest, unpack into DIR/releases/<release>/, repoint DIR/current."""
    from reef.client import install_harness

    installed = install_harness(url, scenario, dir, api_key=api_key)
    typer.echo(f"installed release {installed.release_id} ({installed.digest}) at {installed.path}")


@harness_app.command("rollback")
def rollback(
    release: Annotated[str, typer.Option(help="An already installed release id.")],
    dir: DirOption,
) -> None:
    """Repoint DIR/current to an installed release."""
    from reef.client import rollback_installed

    installed = rollback_installed(dir, release)
    typer.echo(f"current is release {installed.release_id} ({installed.digest})")


@harness_app.command("show")
def show(dir: DirOption) -> None:
    """Print the current installed harness as JSON."""
    from reef.client import current_release

    installed = current_release(dir)
    bundle = installed.load()
    typer.echo(
        json.dumps(
            {
                "release_id": installed.release_id,
                "digest": installed.digest,
                "harness": bundle.harness.model_dump(mode="json"),
                "files": sorted(bundle.files),
            },
            indent=2,
        )
    )

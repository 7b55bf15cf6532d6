"""Command help as Typer's rich help shows it: each docstring paragraph on one line.

Typer's rich help keeps a docstring's line breaks, so text wrapped for the source (88
columns) wraps again at the terminal's width into ragged half-lines. ``unwrap_help``
joins each paragraph's lines once the commands are registered; the terminal wraps them.
"""

from __future__ import annotations

import inspect

import typer


def unwrapped(text: str) -> str:
    """``text`` (a docstring) with each paragraph's lines joined into one."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def unwrap_help(app: typer.Typer) -> None:
    """Give every command of ``app`` and of its sub-apps its help unwrapped (the help
    it was given, else its docstring)."""
    for command in app.registered_commands:
        text = command.help or (inspect.getdoc(command.callback) if command.callback else None)
        if text:
            command.help = unwrapped(text)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            unwrap_help(group.typer_instance)

"""``reef --help`` reads cleanly at 80 columns: the quickstart's line is one short line,
and no command's help keeps the line breaks of its docstring."""

from __future__ import annotations

import inspect

from typer.testing import CliRunner

from reef.cli.help_text import unwrapped
from reef.cli.main import app

NARROW = {"COLUMNS": "80", "TERMINAL_WIDTH": "80"}


def _command_rows(text: str) -> dict[str, list[str]]:
    """The Commands panel: each command's name and the lines of its description."""
    panel = text.split("Commands")[1]
    rows: dict[str, list[str]] = {}
    current = ""
    for line in panel.splitlines()[1:]:
        inner = line.strip().strip("│").rstrip()
        if not inner or line.lstrip().startswith("╰"):
            break
        name, _, rest = inner.strip().partition(" ")
        if inner.startswith("  "):  # a continuation, under the description column
            rows[current].append(inner.strip())
        else:
            current = name
            rows[current] = [rest.strip()]
    return rows


def test_the_quickstart_line_of_reef_help_is_one_line() -> None:
    result = CliRunner().invoke(app, ["--help"], env=NARROW)
    assert result.exit_code == 0, result.output
    rows = _command_rows(result.output)
    assert rows["quickstart"] == [
        "Run Reef end to end on a demo app and measure what it learns."
    ], rows["quickstart"]
    # A description that wraps does so at the panel's width, never after a word or two.
    for name, lines in rows.items():
        for line in lines[:-1]:
            assert len(line) > 50, (name, lines)


def test_the_quickstart_help_wraps_its_paragraphs_at_the_terminal() -> None:
    result = CliRunner().invoke(app, ["quickstart", "--help"], env=NARROW)
    assert result.exit_code == 0, result.output
    body = result.output.split("Options")[0]
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.startswith("A support-ticket"))
    paragraph = lines[start : start + 4]
    assert all(len(line) > 50 for line in paragraph[:-1]), paragraph


def test_unwrapped_joins_lines_and_keeps_paragraphs() -> None:
    doc = """First line
    goes on.

    Second paragraph,
        indented in the source."""
    assert unwrapped(doc) == "First line goes on.\n\nSecond paragraph, indented in the source."


def test_every_command_has_its_help_unwrapped() -> None:
    def commands(typer_app: object) -> list[object]:
        found = list(typer_app.registered_commands)  # type: ignore[attr-defined]
        for group in typer_app.registered_groups:  # type: ignore[attr-defined]
            found += commands(group.typer_instance)
        return found

    for command in commands(app):
        text = command.help or inspect.getdoc(command.callback)  # type: ignore[attr-defined]
        assert text, command
        assert all("\n" not in paragraph for paragraph in text.split("\n\n")), text

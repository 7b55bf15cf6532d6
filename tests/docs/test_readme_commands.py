"""Every ``reef ...`` command the README shows is one the installed ``reef`` has: its
``--help`` succeeds, and lists each option the README gives it. Every script of this
repository the README shows (``scripts/test``) answers ``--help`` too, without doing its
work. Commands come from the shell blocks and the inline code of README.md, as a newcomer
would copy them."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
_SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell|console)\n(.*?)```", re.DOTALL)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_SEPARATORS = re.compile(r"&&|\|\||;|\||\n")


def _pieces(text: str) -> list[list[str]]:
    """The words of each command in ``text``'s shell blocks and inline code."""
    pieces = [part for block in _SHELL_BLOCK.findall(text) for part in _SEPARATORS.split(block)]
    prose = _SHELL_BLOCK.sub("", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    pieces += [part for span in _INLINE.findall(prose) for part in _SEPARATORS.split(span)]
    return [shlex.split(piece.strip()) for piece in pieces]


def readme_commands(text: str) -> list[list[str]]:
    """The argv of each ``reef`` command in ``text``'s shell blocks and inline code."""
    commands = []
    for words in _pieces(text):
        if words[:1] == ["reef"] and len(words) > 1 and words not in commands:
            commands.append(words)
    return commands


def readme_scripts(text: str) -> list[str]:
    """The repository's own scripts that ``text`` runs (``scripts/test``)."""
    scripts = []
    for words in _pieces(text):
        name = words[0].removeprefix("./") if words else ""
        if name.startswith("scripts/") and name not in scripts:
            scripts.append(name)
    return scripts


def _subcommand(argv: list[str]) -> list[str]:
    """The command path: the words after ``reef`` up to the first option or value."""
    path = []
    for word in argv[1:]:
        if word.startswith("-") or not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        path.append(word)
    return path


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))
SCRIPTS = readme_scripts(README.read_text(encoding="utf-8"))


def test_the_readme_shows_its_commands() -> None:
    shown = {" ".join(_subcommand(argv)) for argv in COMMANDS}
    assert {"quickstart", "serve"} <= shown, shown


def test_commands_are_found_in_blocks_and_inline_code() -> None:
    text = "```bash\npip install x && reef quickstart --rounds 1\n```\n"
    text += "then `cd d && reef serve`; `reef serve` again"
    assert readme_commands(text) == [["reef", "quickstart", "--rounds", "1"], ["reef", "serve"]]
    assert readme_commands("```\n client ──► reef gateway\n```") == []  # a picture
    assert readme_scripts("```bash\nscripts/test\n```\nor `./scripts/test -x`") == ["scripts/test"]


def test_the_readme_shows_the_test_script() -> None:
    assert "scripts/test" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_readme_script_has_its_help(script: str) -> None:
    """``--help`` prints the script's usage and stops: it installs nothing, runs nothing."""
    done = subprocess.run(
        [str(README.parent / script), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{script} --help: {done.stderr}"
    assert f"Usage: {script}" in done.stdout, done.stdout


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(argv) for argv in COMMANDS])
def test_every_readme_command_has_its_help(argv: list[str]) -> None:
    path = _subcommand(argv)
    done = subprocess.run(
        [sys.executable, "-m", "reef", *path, "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"reef {' '.join(path)} --help: {done.stderr}"
    for option in (word.split("=")[0] for word in argv if word.startswith("--")):
        assert option in done.stdout, f"reef {' '.join(path)} has no {option}"

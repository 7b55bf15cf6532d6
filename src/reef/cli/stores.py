"""Opening the store for commands that read it: they never create one.

``reef serve``, ``reef worker``, ``reef migrate`` and ``reef learn`` create the store
(``open_store`` migrates); listing and inspecting commands use ``open_existing_store``,
which answers ``StoreNotFoundError`` (exit 3) naming where it looked instead of leaving
an empty ``.reef/`` in whatever directory they were run from.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from reef.core.errors import NotFoundError

if TYPE_CHECKING:
    from reef.config import ReefSettings
    from reef.experience import SQLExperienceStore

_PICK = (
    "run `reef serve` or `reef migrate` to create one, or point at one with --config "
    "(store.url or home in reef.yaml) or REEF_STORE__URL"
)


class StoreNotFoundError(NotFoundError):
    """A command that only reads found no store where the configuration points."""


def open_existing_store(settings: ReefSettings) -> SQLExperienceStore:
    """The configured store, migrated, if it exists. Raises ``StoreNotFoundError`` for
    a SQLite file that does not exist or a PostgreSQL database without Reef's schema,
    and what ``open_store`` raises otherwise."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from reef.experience import open_store

    url = settings.store_url()
    try:
        parsed = make_url(url)
    except ArgumentError:
        return open_store(url)  # raises InvalidInputError naming the URL
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            return open_store(url)  # raises InvalidInputError: SQLite needs a file
        path = Path(parsed.database).expanduser().absolute()
        if not path.exists():
            raise StoreNotFoundError(f"no Reef store at {path}; {_PICK}")
        return open_store(url)
    store = open_store(url, migrate=False)
    try:
        if not _has_schema(store):
            raise StoreNotFoundError(
                f"no Reef store in {parsed.render_as_string(hide_password=True)} "
                f"(the database has no Reef tables); {_PICK}"
            )
        store.migrate()
    except BaseException:
        store.close()
        raise
    return store


def _has_schema(store: SQLExperienceStore) -> bool:
    from sqlalchemy import inspect

    from reef.experience.migrations import VERSION_TABLE
    from reef.experience.sqlengine import unavailable_on_failure

    with unavailable_on_failure(), store.engine.connect() as connection:
        return bool(inspect(connection).has_table(VERSION_TABLE))

"""Alembic migrations of the one schema (``reef.db.schema``), run from code.

Users never need an ``alembic.ini``: ``upgrade(engine)`` builds the Alembic config here,
pointing ``script_location`` at this package, and runs every pending revision inside one
transaction that also serialises concurrent starters (``BEGIN IMMEDIATE`` on SQLite, a
transaction-level advisory lock on PostgreSQL). The second process to start waits, then
finds the schema at head and does nothing.

Extend: add ``versions/NNNN_<what>.py`` (copy the header of the newest one, set
``down_revision``) and the matching change to ``reef.db.schema``; the schema test
fails until both agree.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Engine

VERSION_TABLE = "reef_alembic_version"
SQLITE_BEGIN_OPTION = "reef_sqlite_begin"

# Any constant works; it only has to be the same in every Reef process.
_PG_MIGRATION_LOCK = 0x52454546_0001  # "REEF" + 1


def alembic_config() -> Config:
    """An Alembic ``Config`` for this package's scripts (no ini file)."""
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database behind ``engine`` to ``revision``; safe to run concurrently."""
    config = alembic_config()
    with engine.connect() as connection:
        # The SQLite begin hook (see reef.db.engine) turns this option into
        # BEGIN IMMEDIATE, taking the write lock before Alembic reads the version.
        connection = connection.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        with connection.begin():
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK}
                )
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

"""Alembic environment for the one schema.

Migrations run only through ``reef.db.migrations.upgrade``, which hands over an
open connection (already inside a locked transaction) in ``config.attributes``; there is
no offline mode and no ``alembic.ini``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from reef.db.migrations import VERSION_TABLE
from reef.db.schema import metadata

connection = context.config.attributes.get("connection")
if not isinstance(connection, Connection):
    raise RuntimeError(
        "reef migrations run through reef.db.migrations.upgrade(), not the alembic command line"
    )

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
    render_as_batch=connection.dialect.name == "sqlite",
    transactional_ddl=True,
    # reef.db.migrations.upgrade counts the revisions done and checks each one's rows.
    on_version_apply=context.config.attributes.get("on_version_apply"),
)
with context.begin_transaction():
    context.run_migrations()

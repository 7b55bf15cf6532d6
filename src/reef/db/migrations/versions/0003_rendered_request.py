"""Records keep the request as the upstream received it, when a harness rendered it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

``records.rendered_request_json``: for scenarios whose harness the gateway manages, the
request after the release's harness was applied (system prompt, examples, tools,
params); null when the client's request went upstream unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("rendered_request_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.drop_column("rendered_request_json")

"""Release chain audit columns: who, why and from what every release and candidate came.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02

``releases`` gains ``reason``, ``candidate_id`` (the candidate a publish or promote
consumed) and ``rolled_back_to`` (the release a rollback restored); ``candidates`` gains
``created_by``, ``reason`` and ``updated_at`` plus an index for listing by state. The
unique ``(scenario, seq)`` constraint of ``releases`` already exists since 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.String(64)


def upgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("candidate_id", ID, nullable=True))
        batch.add_column(sa.Column("rolled_back_to", ID, nullable=True))
    with op.batch_alter_table("candidates") as batch:
        batch.add_column(sa.Column("created_by", sa.Text(), nullable=True))
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_candidates_scenario_state", "candidates", ["scenario", "state"])


def downgrade() -> None:
    op.drop_index("ix_candidates_scenario_state", table_name="candidates")
    with op.batch_alter_table("candidates") as batch:
        batch.drop_column("updated_at")
        batch.drop_column("reason")
        batch.drop_column("created_by")
    with op.batch_alter_table("releases") as batch:
        batch.drop_column("rolled_back_to")
        batch.drop_column("candidate_id")
        batch.drop_column("reason")

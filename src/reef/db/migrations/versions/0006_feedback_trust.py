"""Feedback keeps its author's trust level and can be quarantined.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

``feedback`` gains ``trust`` (the level its principal had when it was written:
``operator``, ``user`` or ``untrusted``) and the quarantine columns: ``quarantine_reason``
and ``quarantined_at`` (set by the screening of a learning run; quarantined feedback is
never trained on or used as evidence) and ``released_at`` / ``released_by`` (an admin let
it through; screening leaves released feedback alone). Feedback written before this
revision gets ``operator`` when it has no principal (no keys were configured: the one
caller was the operator) and ``user`` when it has one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("feedback") as batch:
        batch.add_column(sa.Column("trust", sa.String(20), nullable=True))
        batch.add_column(sa.Column("quarantine_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("quarantined_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("released_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("released_by", sa.Text(), nullable=True))
    op.execute("UPDATE feedback SET trust = 'operator' WHERE principal IS NULL")
    op.execute("UPDATE feedback SET trust = 'user' WHERE principal IS NOT NULL")
    with op.batch_alter_table("feedback") as batch:
        batch.alter_column("trust", existing_type=sa.String(20), nullable=False)
    op.create_index(
        "ix_feedback_scenario_quarantined_at", "feedback", ["scenario", "quarantined_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_feedback_scenario_quarantined_at", table_name="feedback")
    with op.batch_alter_table("feedback") as batch:
        for column in ("released_by", "released_at", "quarantined_at", "quarantine_reason"):
            batch.drop_column(column)
        batch.drop_column("trust")

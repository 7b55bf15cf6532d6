"""Feedback says where it came from: posted, or computed from the traffic.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

``feedback`` gains ``source`` (``explicit`` for feedback posted to ``/reef/feedback``;
``signal:<name>`` and ``judge:<name>`` for feedback Reef computed from the conversation
or an LLM judge) and ``confidence`` (the computing rule's, in [0, 1]; none for posted
feedback). Every earlier row was posted: ``explicit``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("feedback") as batch:
        batch.add_column(
            sa.Column("source", sa.String(80), nullable=False, server_default="explicit")
        )
        batch.add_column(sa.Column("confidence", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("feedback") as batch:
        batch.drop_column("confidence")
        batch.drop_column("source")

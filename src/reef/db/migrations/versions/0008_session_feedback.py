"""Feedback can be about a whole session: the task's outcome.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

``feedback`` gains ``session_id``: set when the feedback is the outcome of a session's
task (``POST /reef/feedback`` with a ``session_id``) rather than about named records only;
``feedback_refs`` then names at most the one turn it targets. Learning spreads such an
outcome over the session's turns by the recipe's credit policy. Earlier feedback has none.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("feedback") as batch:
        batch.add_column(sa.Column("session_id", sa.Text(), nullable=True))
    op.create_index("ix_feedback_scenario_session_id", "feedback", ["scenario", "session_id"])


def downgrade() -> None:
    op.drop_index("ix_feedback_scenario_session_id", table_name="feedback")
    with op.batch_alter_table("feedback") as batch:
        batch.drop_column("session_id")

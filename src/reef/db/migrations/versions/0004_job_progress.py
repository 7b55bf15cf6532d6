"""Jobs report progress, logs and metrics, and name the candidate they proposed.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

``jobs`` gains ``progress`` (a fraction in [0, 1]), ``message`` (the latest progress
line), ``error`` (why the last attempt failed), ``logs_json`` (recent progress lines),
``metrics_json`` (named values the learners reported) and ``candidate_id`` (the candidate
the job proposed, so a retried job finds it instead of proposing another), plus an
index for "does this scenario have a queued or running job".
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("progress", sa.Float(), nullable=True))
        batch.add_column(sa.Column("message", sa.Text(), nullable=True))
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("logs_json", sa.Text(), nullable=True))
        batch.add_column(sa.Column("metrics_json", sa.Text(), nullable=True))
        batch.add_column(sa.Column("candidate_id", sa.String(64), nullable=True))
    op.create_index("ix_jobs_scenario_state", "jobs", ["scenario", "state"])


def downgrade() -> None:
    op.drop_index("ix_jobs_scenario_state", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        for column in ("candidate_id", "metrics_json", "logs_json", "error", "message"):
            batch.drop_column(column)
        batch.drop_column("progress")

"""The evaluation gate's runs and per-item results.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

``evaluations`` holds one row per comparison of a candidate (or release) against a
baseline release: its state, verdict, decision evidence and settings; ``eval_results``
one row per item, arm and repeat: the score, the answer and the eval record that holds
the exchange; ``eval_items`` the items asked (those that admitted a release stay in force
as a regression suite).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "evaluations",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("scenario", sa.Text(), nullable=False),
        sa.Column("candidate_id", sa.String(64), nullable=False),
        sa.Column("baseline_id", sa.String(64), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("verdict", sa.String(20), nullable=True),
        sa.Column("decision_json", sa.Text(), nullable=True),
        sa.Column("meta_json", sa.Text(), nullable=True),
        sa.Column("created_by", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_evaluations"),
    )
    op.create_index("ix_evaluations_scenario_created_at", "evaluations", ["scenario", "created_at"])
    op.create_index("ix_evaluations_candidate_id", "evaluations", ["candidate_id"])
    op.create_table(
        "eval_results",
        sa.Column("evaluation_id", sa.String(64), nullable=False),
        sa.Column("item_key", sa.Text(), nullable=False),
        sa.Column("arm", sa.String(20), nullable=False),
        sa.Column("repeat", sa.Integer(), nullable=False),
        sa.Column("suite", sa.Text(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("record_id", sa.String(64), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("details_json", sa.Text(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint(
            "evaluation_id", "item_key", "arm", "repeat", name="pk_eval_results"
        ),
    )
    op.create_table(
        "eval_items",
        sa.Column("evaluation_id", sa.String(64), nullable=False),
        sa.Column("item_key", sa.Text(), nullable=False),
        sa.Column("suite", sa.Text(), nullable=False),
        sa.Column("item_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("evaluation_id", "item_key", name="pk_eval_items"),
    )


def downgrade() -> None:
    op.drop_table("eval_items")
    op.drop_table("eval_results")
    op.drop_index("ix_evaluations_candidate_id", table_name="evaluations")
    op.drop_index("ix_evaluations_scenario_created_at", table_name="evaluations")
    op.drop_table("evaluations")

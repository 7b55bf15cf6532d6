"""The gate's episodes: one row per episode an evaluation played.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

``eval_episodes`` holds, per evaluation, task, arm and repeat, how one episode of
``gate.episodes`` went: the release it pinned, its score and reason, its stop cause
(and error), turns, tool calls (counted by status), the session the gateway recorded
it under, the records' ids, the conversation and its duration.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "eval_episodes",
        sa.Column("evaluation_id", sa.String(64), nullable=False),
        sa.Column("item_key", sa.Text(), nullable=False),
        sa.Column("arm", sa.String(20), nullable=False),
        sa.Column("repeat", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("release_id", sa.String(64), nullable=False),
        sa.Column("environment", sa.Text(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("stop", sa.String(20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("turns", sa.Integer(), nullable=False),
        sa.Column("tool_calls", sa.Integer(), nullable=False),
        sa.Column("tool_status_json", sa.Text(), nullable=True),
        sa.Column("session_id", sa.String(64), nullable=True),
        sa.Column("record_ids_json", sa.Text(), nullable=True),
        sa.Column("messages_json", sa.Text(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint(
            "evaluation_id", "item_key", "arm", "repeat", name="pk_eval_episodes"
        ),
    )


def downgrade() -> None:
    op.drop_table("eval_episodes")

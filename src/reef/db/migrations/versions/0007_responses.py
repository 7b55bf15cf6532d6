"""Stored responses of the OpenAI Responses API.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08

``responses`` holds one row per response the gateway answered on ``POST /v1/responses``
with ``store`` left on: its id (``resp_…``), scenario, session and record, the response
it continued (``previous_response_id``), the key that created it, the whole input it
answered (earlier turns included, as items) and the response object. It is what
``previous_response_id``, ``GET /v1/responses/{id}`` and its ``input_items`` read.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("scenario", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("record_id", sa.String(64), nullable=True),
        sa.Column("previous_response_id", sa.String(64), nullable=True),
        sa.Column("principal", sa.Text(), nullable=True),
        sa.Column("input_json", sa.Text(), nullable=False),
        sa.Column("response_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_responses"),
    )
    op.create_index("ix_responses_scenario_created_at", "responses", ["scenario", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_responses_scenario_created_at", table_name="responses")
    op.drop_table("responses")

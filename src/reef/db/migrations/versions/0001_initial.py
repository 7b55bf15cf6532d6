"""The initial experience schema (DESIGN.md §3).

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written out in full rather than built from ``reef.db.schema``, so that later
schema edits cannot change what this revision creates.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.String(64)
HASH = sa.String(100)


def upgrade() -> None:
    op.create_table(
        "scenarios",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_scenarios"),
    )
    op.create_table(
        "records",
        sa.Column("id", ID, nullable=False),
        sa.Column("scenario", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("release_id", ID, nullable=True),
        sa.Column("api", sa.String(40), nullable=False),
        sa.Column("request_json", sa.Text(), nullable=False),
        sa.Column("response_json", sa.Text(), nullable=True),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("usage_json", sa.Text(), nullable=True),
        sa.Column("prompt_hash", HASH, nullable=False),
        sa.Column("content_hash", HASH, nullable=False),
        sa.Column("continuation_hash", HASH, nullable=True),
        sa.Column("tags_json", sa.Text(), nullable=False),
        sa.Column("principal", sa.Text(), nullable=True),
        sa.Column("purpose", sa.String(20), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_records"),
        sa.ForeignKeyConstraint(
            ["scenario"], ["scenarios.name"], name="fk_records_scenario_scenarios"
        ),
    )
    op.create_index(
        "ix_records_scenario_created_at_id", "records", ["scenario", "created_at", "id"]
    )
    op.create_index(
        "ix_records_scenario_session_id_turn", "records", ["scenario", "session_id", "turn"]
    )
    op.create_index(
        "ix_records_scenario_continuation_hash_created_at_id",
        "records",
        ["scenario", "continuation_hash", "created_at", "id"],
    )
    op.create_index("ix_records_content_hash", "records", ["content_hash"])
    op.create_index(
        "ix_records_scenario_idempotency_key",
        "records",
        ["scenario", "idempotency_key"],
        unique=True,
    )
    op.create_table(
        "feedback",
        sa.Column("id", ID, nullable=False),
        sa.Column("scenario", sa.Text(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("feedback_json", sa.Text(), nullable=True),
        sa.Column("correction_json", sa.Text(), nullable=True),
        sa.Column("metadata_json", sa.Text(), nullable=False),
        sa.Column("principal", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("body_hash", HASH, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_feedback"),
        sa.ForeignKeyConstraint(
            ["scenario"], ["scenarios.name"], name="fk_feedback_scenario_scenarios"
        ),
        sa.UniqueConstraint(
            "scenario", "idempotency_key", name="uq_feedback_scenario_idempotency_key"
        ),
    )
    op.create_index("ix_feedback_scenario_created_at", "feedback", ["scenario", "created_at"])
    op.create_table(
        "feedback_refs",
        sa.Column("feedback_id", ID, nullable=False),
        sa.Column("record_id", ID, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("feedback_id", "record_id", name="pk_feedback_refs"),
        sa.ForeignKeyConstraint(
            ["feedback_id"], ["feedback.id"], name="fk_feedback_refs_feedback_id_feedback"
        ),
        sa.ForeignKeyConstraint(
            ["record_id"], ["records.id"], name="fk_feedback_refs_record_id_records"
        ),
    )
    op.create_index("ix_feedback_refs_record_id", "feedback_refs", ["record_id"])
    op.create_table(
        "artifacts",
        sa.Column("digest", HASH, nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("meta_json", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("digest", name="pk_artifacts"),
    )
    op.create_table(
        "candidates",
        sa.Column("id", ID, nullable=False),
        sa.Column("scenario", sa.Text(), nullable=False),
        sa.Column("parent_release_id", ID, nullable=True),
        sa.Column("manifest_json", sa.Text(), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("eval_json", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_candidates"),
    )
    op.create_index("ix_candidates_scenario_created_at", "candidates", ["scenario", "created_at"])
    op.create_table(
        "releases",
        sa.Column("id", ID, nullable=False),
        sa.Column("scenario", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("parent_id", ID, nullable=True),
        sa.Column("operation", sa.String(20), nullable=False),
        sa.Column("manifest_json", sa.Text(), nullable=False),
        sa.Column("eval_json", sa.Text(), nullable=True),
        sa.Column("created_by", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_releases"),
        sa.UniqueConstraint("scenario", "seq", name="uq_releases_scenario_seq"),
    )
    op.create_table(
        "heads",
        sa.Column("scenario", sa.Text(), nullable=False),
        sa.Column("release_id", ID, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("scenario", name="pk_heads"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", ID, nullable=False),
        sa.Column("scenario", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("input_json", sa.Text(), nullable=True),
        sa.Column("result_json", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_state_lease_until", "jobs", ["state", "lease_until"])
    op.create_index("ix_jobs_scenario_created_at", "jobs", ["scenario", "created_at"])
    op.create_table(
        "consumed",
        sa.Column("record_id", ID, nullable=False),
        sa.Column("job_id", ID, nullable=False),
        sa.PrimaryKeyConstraint("record_id", "job_id", name="pk_consumed"),
    )
    op.create_index("ix_consumed_job_id", "consumed", ["job_id"])


def downgrade() -> None:
    for table in (
        "consumed",
        "jobs",
        "heads",
        "releases",
        "candidates",
        "artifacts",
        "feedback_refs",
        "feedback",
        "records",
        "scenarios",
    ):
        op.drop_table(table)

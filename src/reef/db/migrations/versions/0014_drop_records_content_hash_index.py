"""Drop the index on ``records.content_hash``: no query reads through it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

Records are deduplicated by their content hash in Python, over the records a recipe
selects (``reef.learning.selection``); nothing looks a record up by it. The index only
cost every insert a random page of its own (the hash is uniformly random): the gateway's
``sync`` write path spent 1.06-1.51x the CPU per record with it, in transactions of 1 to
16 records over a store of 100,000 (``bench/record_writes.py``; docs/benchmarks.md,
"Where the tail comes from: capture").
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_records_content_hash", table_name="records")


def downgrade() -> None:
    op.create_index("ix_records_content_hash", "records", ["content_hash"])

"""Idempotency claims: which gateway on the store calls the upstream for a key.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05

``idempotency_claims`` holds one row per idempotency key in flight (per scenario): the
fingerprint of its request, the gateway that calls the upstream for it (``owner``),
when it claimed the key and when that lease runs out. Gateways sharing one store
(``reef serve --workers``) meet there, so a key gets one upstream call across all of
them (``reef.experience.claims``). Rows live only while a key is in flight: the table
starts empty.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idempotency_claims",
        sa.Column("scenario", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scenario", "key", name="pk_idempotency_claims"),
    )


def downgrade() -> None:
    op.drop_table("idempotency_claims")

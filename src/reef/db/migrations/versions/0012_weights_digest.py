"""Verified weights: the digest each record's weights were last verified as.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

``records`` gains ``weights_digest``: the adapter or checkpoint digest the gateway last
verified (its fingerprint, ``reef.gateway.serving.verify``) for the weights that served
the record; null for the base model, weights without a fingerprint, or records made
before this revision.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("weights_digest", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.drop_column("weights_digest")

"""Spend: what each record cost, and the budget windows' counters.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05

``records`` gains ``cost`` (money, from the record's usage and its model's price; null
when the model has no price or no usage was reported) and ``price_json`` (the price it
was computed with: a price table can change, a record keeps its own).
``spend_windows`` holds, per budget and window start, the tokens and money spent or
reserved in it: the ledger that gateways sharing one store count against
(``budgets.ledger: store``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("cost", sa.Float(), nullable=True))
        batch.add_column(sa.Column("price_json", sa.Text(), nullable=True))
    op.create_table(
        "spend_windows",
        sa.Column("budget", sa.Text(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("money", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("budget", "window_start", name="pk_spend_windows"),
    )


def downgrade() -> None:
    op.drop_table("spend_windows")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("price_json")
        batch.drop_column("cost")

"""orders and shop_effects

Revision ID: shop_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "shop_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("customer", sa.Text(), nullable=False),
        sa.Column("amount", sa.Numeric(12, 2), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("amount >= 0", name="orders_amount_check"),
    )
    op.create_table(
        "shop_effects",
        sa.Column("tag", sa.Text(), primary_key=True),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("written_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("shop_effects")
    op.drop_table("orders")

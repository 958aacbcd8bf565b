"""Spark snapshots leased per driver

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Drivers with their own fencing epoch replace the one epoch per processor; snapshots get a lease."""
    op.create_table(
        "outboxq_spark_drivers",
        sa.Column("driver_id", sa.Text(), nullable=False),
        sa.Column("processor_id", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("driver_id"),
    )
    op.drop_table("outboxq_spark_processors")
    op.add_column("outboxq_spark_snapshots", sa.Column("driver_id", sa.Text(), nullable=True))
    op.add_column("outboxq_spark_snapshots",
                  sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Back to one fencing epoch per processor (the drivers' epochs are dropped)."""
    op.drop_column("outboxq_spark_snapshots", "lease_expires_at")
    op.drop_column("outboxq_spark_snapshots", "driver_id")
    op.create_table(
        "outboxq_spark_processors",
        sa.Column("processor_id", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("processor_id"),
    )
    op.drop_table("outboxq_spark_drivers")

"""Spark streaming queries reading outboxq (format "outboxq"): one row each, for operators and metrics

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The outboxq_spark_streams table."""
    op.create_table(
        "outboxq_spark_streams",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("application_id", sa.Text()),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("micro_batches", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("jobs_read", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("lease_renewals", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    """Drop it."""
    op.drop_table("outboxq_spark_streams")

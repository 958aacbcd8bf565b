"""The live workers' registry (each worker process announces itself, its queues and its jobs in flight), and
schedules an operator can pause

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The outboxq_workers table; outboxq_schedules.paused."""
    op.create_table(
        "outboxq_workers",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("queues", JSONB(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("in_flight", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("outboxq_workers_last_seen_at_idx", "outboxq_workers", ["last_seen_at"])
    op.add_column("outboxq_schedules", sa.Column("paused", sa.Boolean(), server_default=sa.text("false"),
                                                 nullable=False))


def downgrade() -> None:
    """Drop them."""
    op.drop_column("outboxq_schedules", "paused")
    op.drop_index("outboxq_workers_last_seen_at_idx", table_name="outboxq_workers")
    op.drop_table("outboxq_workers")

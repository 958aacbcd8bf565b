"""Global and per-key concurrency and rate limits

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The jobs' limit key and its claim index, the queues' limits, the rate limits' start log."""
    op.add_column("outboxq_jobs", sa.Column("limit_key", sa.Text(), nullable=True))
    op.create_index(
        "outboxq_jobs_limit_key_idx",
        "outboxq_jobs",
        ["queue", "limit_key", "priority", "run_at", "id"],
        unique=False,
        postgresql_where=sa.text("status IN ('queued', 'retrying') AND limit_key IS NOT NULL"),
    )
    op.create_table(
        "outboxq_queue_limits",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("global_concurrency", sa.Integer(), nullable=True),
        sa.Column("rate_limit_count", sa.Integer(), nullable=True),
        sa.Column("rate_limit_period_s", sa.Float(), nullable=True),
        sa.Column("per_key", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("source", sa.Text(), server_default=sa.text("'consumer'"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("global_concurrency IS NULL OR global_concurrency >= 0",
                           name="outboxq_queue_limits_global_concurrency_check"),
        sa.CheckConstraint(
            "(rate_limit_count IS NULL) = (rate_limit_period_s IS NULL) "
            "AND (rate_limit_count IS NULL OR (rate_limit_count >= 0 AND rate_limit_period_s > 0))",
            name="outboxq_queue_limits_rate_limit_check"),
        sa.CheckConstraint("source IN ('consumer', 'operator')", name="outboxq_queue_limits_source_check"),
        sa.PrimaryKeyConstraint("queue"),
    )
    op.create_table(
        "outboxq_limit_starts",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("limit_key", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("starts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("outboxq_limit_starts_queue_idx", "outboxq_limit_starts", ["queue", "started_at"],
                    unique=False)


def downgrade() -> None:
    """Drop what upgrade() created."""
    op.drop_index("outboxq_limit_starts_queue_idx", table_name="outboxq_limit_starts")
    op.drop_table("outboxq_limit_starts")
    op.drop_table("outboxq_queue_limits")
    op.drop_index("outboxq_jobs_limit_key_idx", table_name="outboxq_jobs")
    op.drop_column("outboxq_jobs", "limit_key")

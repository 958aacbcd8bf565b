"""Periodic schedules, uniqueness that ends, snooze, results and progress, on_dependency_failure

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from outboxq.queue.schema import KEY_HELD_PREDICATE

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The jobs' new columns, the key index split in two (lookup, uniqueness), the schedules."""
    op.add_column("outboxq_jobs", sa.Column("unique_scope", sa.Text(), server_default=sa.text("'forever'"),
                                            nullable=False))
    op.add_column("outboxq_jobs", sa.Column("on_dependency_failure", sa.Text(),
                                            server_default=sa.text("'wait'"), nullable=False))
    op.add_column("outboxq_jobs", sa.Column("snoozes", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("outboxq_jobs", sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column("outboxq_jobs", sa.Column("progress", sa.Float(), nullable=True))
    op.add_column("outboxq_jobs", sa.Column("progress_message", sa.Text(), nullable=True))
    op.create_check_constraint("outboxq_jobs_unique_scope_check", "outboxq_jobs",
                               "unique_scope IN ('forever', 'active', 'window')")
    op.create_check_constraint("outboxq_jobs_on_dependency_failure_check", "outboxq_jobs",
                               "on_dependency_failure IN ('wait', 'cancel', 'run')")
    op.create_check_constraint("outboxq_jobs_progress_check", "outboxq_jobs",
                               "progress IS NULL OR (progress >= 0 AND progress <= 1)")
    # Every existing job is 'forever': the new unique index holds exactly the keys the old one did.
    op.create_index("outboxq_jobs_key_unique_idx", "outboxq_jobs", ["queue", "key"], unique=True,
                    postgresql_where=sa.text(KEY_HELD_PREDICATE))
    op.drop_index("outboxq_jobs_key_idx", table_name="outboxq_jobs")
    op.create_index("outboxq_jobs_key_idx", "outboxq_jobs", ["queue", "key"], unique=False,
                    postgresql_where=sa.text("key IS NOT NULL"))
    op.add_column("outboxq_job_errors", sa.Column("kind", sa.Text(), server_default=sa.text("'error'"),
                                                  nullable=False))
    op.create_check_constraint("outboxq_job_errors_kind_check", "outboxq_job_errors", "kind IN ('error', 'snooze')")
    op.create_table(
        "outboxq_schedules",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("timezone", sa.Text(), nullable=False),
        sa.Column("missed", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("last_slot", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_slot", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_job_id", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("missed IN ('latest', 'skip', 'all')", name="outboxq_schedules_missed_check"),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    """Drop what upgrade() created; the key index becomes unique for every key again."""
    op.drop_table("outboxq_schedules")
    op.drop_constraint("outboxq_job_errors_kind_check", "outboxq_job_errors")
    op.drop_column("outboxq_job_errors", "kind")
    op.drop_index("outboxq_jobs_key_idx", table_name="outboxq_jobs")
    op.drop_index("outboxq_jobs_key_unique_idx", table_name="outboxq_jobs")
    op.create_index("outboxq_jobs_key_idx", "outboxq_jobs", ["queue", "key"], unique=True,
                    postgresql_where=sa.text("key IS NOT NULL"))
    for name in ("outboxq_jobs_progress_check", "outboxq_jobs_on_dependency_failure_check",
                 "outboxq_jobs_unique_scope_check"):
        op.drop_constraint(name, "outboxq_jobs")
    for column in ("progress_message", "progress", "result", "snoozes", "on_dependency_failure", "unique_scope"):
        op.drop_column("outboxq_jobs", column)

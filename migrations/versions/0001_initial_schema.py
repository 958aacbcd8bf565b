"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 22:45:41.595259
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from outboxq.queue.sql.schema_ddl import NOTIFY_FUNCTION_DDL, NOTIFY_TRIGGER_DDL

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The initial schema, written out table by table in one function: a migration is read as one DDL script,
    and splitting it into helpers would scatter the schema it records (so it stays over 60 lines)."""
    op.create_table(
        "outboxq_idempotency_keys",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("response_status", sa.Integer(), nullable=False),
        sa.Column("response_body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("scope", "key", name="outboxq_idempotency_keys_pkey"),
    )
    op.create_table(
        "outboxq_jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), server_default=sa.text("'queued'"), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("payload_bytes", sa.LargeBinary(), nullable=True),
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("run_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("lease_token", sa.UUID(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker_id", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_traceback", sa.Text(), nullable=True),
        sa.Column("waiting_reason", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("context", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "created_xid",
            sa.BigInteger(),
            server_default=sa.text("(pg_current_xact_id())::text::bigint"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempt_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('waiting', 'queued', 'running', 'retrying', 'done', 'dead', 'cancelled')",
            name="outboxq_jobs_status_check",
        ),
        sa.CheckConstraint(
            "max_attempts IS NULL OR max_attempts >= 0", name="outboxq_jobs_max_attempts_check"
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "outboxq_jobs_claim_idx",
        "outboxq_jobs",
        ["queue", "priority", "run_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index("outboxq_jobs_feed_idx", "outboxq_jobs", ["queue", "created_xid", "id"], unique=False)
    op.create_index(
        "outboxq_jobs_finished_idx",
        "outboxq_jobs",
        ["finished_at"],
        unique=False,
        postgresql_where=sa.text("status IN ('done', 'dead', 'cancelled')"),
    )
    op.create_index(
        "outboxq_jobs_key_idx",
        "outboxq_jobs",
        ["queue", "key"],
        unique=True,
        postgresql_where=sa.text("key IS NOT NULL"),
    )
    op.create_index(
        "outboxq_jobs_lease_idx",
        "outboxq_jobs",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index(
        "outboxq_jobs_retry_idx",
        "outboxq_jobs",
        ["queue", "run_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'retrying'"),
    )
    op.create_index(
        "outboxq_jobs_waiting_idx",
        "outboxq_jobs",
        ["queue"],
        unique=False,
        postgresql_where=sa.text("status = 'waiting'"),
    )
    op.create_table(
        "outboxq_queues",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failing_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("consecutive_failures", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_success_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("queue"),
    )
    op.create_table(
        "outboxq_spark_batches",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("processor", sa.Text(), nullable=False),
        sa.Column("output_table", sa.Text(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("master", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("jobs_claimed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("rows_written", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('pending', 'running', 'done', 'failed')", name="outboxq_spark_batches_state_check"
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "outboxq_spark_processors",
        sa.Column("processor_id", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("processor_id"),
    )
    op.create_table(
        "outboxq_spark_snapshots",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("processor_id", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("job_ids", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("lease_token", sa.UUID(), nullable=False),
        sa.Column("delivery_hash", sa.Text(), nullable=False),
        sa.Column("output_table", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'claimed'"), nullable=False),
        sa.Column("rows_written", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('claimed', 'delivered', 'failed')", name="outboxq_spark_snapshots_state_check"
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("delivery_hash", name="outboxq_spark_snapshots_delivery_hash_key"),
    )
    op.create_index(
        "outboxq_spark_snapshots_pending_idx",
        "outboxq_spark_snapshots",
        ["processor_id"],
        unique=False,
        postgresql_where=sa.text("state = 'claimed'"),
    )
    op.create_table(
        "outboxq_job_dependencies",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("depends_on_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["outboxq_jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "depends_on_id", name="outboxq_job_dependencies_pkey"),
    )
    op.create_index(
        "outboxq_job_dependencies_depends_on_idx", "outboxq_job_dependencies", ["depends_on_id"], unique=False
    )
    op.create_table(
        "outboxq_job_errors",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.Column("failed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["outboxq_jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("outboxq_job_errors_job_idx", "outboxq_job_errors", ["job_id"], unique=False)
    op.execute(NOTIFY_FUNCTION_DDL)
    op.execute(NOTIFY_TRIGGER_DDL)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS outboxq_jobs_notify_new ON outboxq_jobs")
    op.execute("DROP FUNCTION IF EXISTS outboxq_notify_new_jobs()")
    op.drop_index("outboxq_job_errors_job_idx", table_name="outboxq_job_errors")
    op.drop_table("outboxq_job_errors")
    op.drop_index("outboxq_job_dependencies_depends_on_idx", table_name="outboxq_job_dependencies")
    op.drop_table("outboxq_job_dependencies")
    op.drop_index(
        "outboxq_spark_snapshots_pending_idx",
        table_name="outboxq_spark_snapshots",
        postgresql_where=sa.text("state = 'claimed'"),
    )
    op.drop_table("outboxq_spark_snapshots")
    op.drop_table("outboxq_spark_processors")
    op.drop_table("outboxq_spark_batches")
    op.drop_table("outboxq_queues")
    op.drop_index(
        "outboxq_jobs_waiting_idx", table_name="outboxq_jobs", postgresql_where=sa.text("status = 'waiting'")
    )
    op.drop_index(
        "outboxq_jobs_retry_idx", table_name="outboxq_jobs", postgresql_where=sa.text("status = 'retrying'")
    )
    op.drop_index(
        "outboxq_jobs_lease_idx", table_name="outboxq_jobs", postgresql_where=sa.text("status = 'running'")
    )
    op.drop_index(
        "outboxq_jobs_key_idx", table_name="outboxq_jobs", postgresql_where=sa.text("key IS NOT NULL")
    )
    op.drop_index(
        "outboxq_jobs_finished_idx",
        table_name="outboxq_jobs",
        postgresql_where=sa.text("status IN ('done', 'dead', 'cancelled')"),
    )
    op.drop_index("outboxq_jobs_feed_idx", table_name="outboxq_jobs")
    op.drop_index(
        "outboxq_jobs_claim_idx", table_name="outboxq_jobs", postgresql_where=sa.text("status = 'queued'")
    )
    op.drop_table("outboxq_jobs")
    op.drop_table("outboxq_idempotency_keys")

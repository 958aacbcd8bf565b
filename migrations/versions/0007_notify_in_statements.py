"""New jobs notify their queue's workers from the statements that write them, not from a trigger

The AFTER INSERT trigger (a plpgsql function over the statement's transition table) cost a sixth of a single
enqueue's throughput; the INSERTs of outboxq.queue.sql now send the same notification themselves
(sql.jobs.NOTIFY_IF_READY, and sql.jobs.job_notify_ready after a COPY). A job written by other means wakes no
worker: the workers' poll finds it.

Revision ID: 0007
Revises: 0006
"""

from alembic import op

from outboxq.queue.sql.schema_ddl import NOTIFY_FUNCTION_DDL, NOTIFY_TRIGGER_DDL

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Drop the notification trigger and its function."""
    op.execute("DROP TRIGGER IF EXISTS outboxq_jobs_notify_new ON outboxq_jobs")
    op.execute("DROP FUNCTION IF EXISTS outboxq_notify_new_jobs()")


def downgrade() -> None:
    """Put the trigger back (the statements' own notifications then come twice, folded at COMMIT)."""
    op.execute(NOTIFY_FUNCTION_DDL)
    op.execute(NOTIFY_TRIGGER_DDL)

"""History out of the figures' way: the job errors' failed_at index, so the throughput chart reads a window of
history instead of all of it

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Index outboxq_job_errors by failed_at."""
    op.create_index("outboxq_job_errors_failed_at_idx", "outboxq_job_errors", ["failed_at"])


def downgrade() -> None:
    """Drop the index."""
    op.drop_index("outboxq_job_errors_failed_at_idx", table_name="outboxq_job_errors")

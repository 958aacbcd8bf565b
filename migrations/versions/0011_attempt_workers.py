"""The worker of each attempt in a job's history (the dashboard's timeline)

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """outboxq_job_errors.worker_id (NULL for the attempts recorded before)."""
    op.add_column("outboxq_job_errors", sa.Column("worker_id", sa.Text()))


def downgrade() -> None:
    """Drop it."""
    op.drop_column("outboxq_job_errors", "worker_id")

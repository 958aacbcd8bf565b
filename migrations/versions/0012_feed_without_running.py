"""The listing feed's index without the running jobs: a claim no longer writes an entry into it

Revision ID: 0012
Revises: 0011

A claim's UPDATE (queued to running) changes indexed columns, so PostgreSQL writes a new entry for the row into
every index whose predicate the new row version meets; the feed index, on every row, took one per claim, the
dearest of the claim's index entries (an entry beside the same key's entry of the version before it). The running
jobs of a listing page come from the lease index instead (sql.job_feed_page). The new index is built before the
old one is dropped, in the migration's transaction: writes to outboxq_jobs wait for the build (seconds per
million jobs).
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """outboxq_jobs_feed_idx keeps every job but the running ones."""
    op.create_index("outboxq_jobs_feed_idx_new", "outboxq_jobs", ["queue", "created_xid", "id"],
                    postgresql_where=sa.text("status <> 'running'"))
    op.drop_index("outboxq_jobs_feed_idx", table_name="outboxq_jobs")
    op.execute("ALTER INDEX outboxq_jobs_feed_idx_new RENAME TO outboxq_jobs_feed_idx")


def downgrade() -> None:
    """The feed index on every job again."""
    op.create_index("outboxq_jobs_feed_idx_all", "outboxq_jobs", ["queue", "created_xid", "id"])
    op.drop_index("outboxq_jobs_feed_idx", table_name="outboxq_jobs")
    op.execute("ALTER INDEX outboxq_jobs_feed_idx_all RENAME TO outboxq_jobs_feed_idx")

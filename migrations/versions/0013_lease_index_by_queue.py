"""The lease index by queue: a limited queue's count of its running jobs reads only its own

Revision ID: 0013
Revises: 0012

Every claim of a limited queue counts the queue's running jobs, and so does every completion that hands a
slot over. On the lease index (lease_expires_at: every queue's running jobs) each count read, and visited the
row of, every running job of every queue: a limited queue's claims slowed down with the work of the queues
beside it. The index is now (queue, lease_expires_at): a count reads the queue's own entries; the listing's and
the Spark sources' running jobs too. The rescue of expired leases reads the whole index (its entries are the
running jobs, as many as the workers hold), the lease its index condition. (The limit key was left out: with
it, a per-key claim's new entries land in as many places of the index as it has keys, instead of at the end of
the queue's range, and the claim cost more.) Built before the old one is dropped, in the migration's
transaction: writes to outboxq_jobs wait for the build (the running jobs only: milliseconds).
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """outboxq_jobs_lease_idx on (queue, lease_expires_at)."""
    op.create_index("outboxq_jobs_lease_idx_new", "outboxq_jobs", ["queue", "lease_expires_at"],
                    postgresql_where=sa.text("status = 'running'"))
    op.drop_index("outboxq_jobs_lease_idx", table_name="outboxq_jobs")
    op.execute("ALTER INDEX outboxq_jobs_lease_idx_new RENAME TO outboxq_jobs_lease_idx")


def downgrade() -> None:
    """outboxq_jobs_lease_idx on lease_expires_at again."""
    op.create_index("outboxq_jobs_lease_idx_old", "outboxq_jobs", ["lease_expires_at"],
                    postgresql_where=sa.text("status = 'running'"))
    op.drop_index("outboxq_jobs_lease_idx", table_name="outboxq_jobs")
    op.execute("ALTER INDEX outboxq_jobs_lease_idx_old RENAME TO outboxq_jobs_lease_idx")

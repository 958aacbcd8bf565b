"""Workflows (DAGs of steps, each a job) and sequences (jobs that run one at a time, in enqueue order)

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The workflows table, the steps' and sequences' columns of outboxq_jobs, per-edge failure policies."""
    op.create_table(
        "outboxq_workflows",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("cancelled_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("outboxq_workflows_created_at_idx", "outboxq_workflows", ["created_at"])
    op.create_table(
        "outboxq_sequences",
        sa.Column("sequence", sa.Text(), nullable=False),
        sa.Column("last_job_id", sa.BigInteger()),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("sequence"),
    )
    op.add_column("outboxq_jobs", sa.Column("workflow_id", sa.BigInteger()))
    op.add_column("outboxq_jobs", sa.Column("step", sa.Text()))
    op.add_column("outboxq_jobs", sa.Column("sequence", sa.Text()))
    op.create_index("outboxq_jobs_workflow_step_idx", "outboxq_jobs", ["workflow_id", "step"], unique=True,
                    postgresql_where=sa.text("workflow_id IS NOT NULL"))
    op.create_index("outboxq_jobs_sequence_idx", "outboxq_jobs", ["sequence", "id"],
                    postgresql_where=sa.text("sequence IS NOT NULL"))
    op.add_column("outboxq_job_dependencies", sa.Column("on_failure", sa.Text()))
    op.create_check_constraint("outboxq_job_dependencies_on_failure_check", "outboxq_job_dependencies",
                               "on_failure IN ('wait', 'cancel', 'run', 'sequence')")


def downgrade() -> None:
    """Drop them."""
    op.drop_constraint("outboxq_job_dependencies_on_failure_check", "outboxq_job_dependencies", type_="check")
    op.drop_column("outboxq_job_dependencies", "on_failure")
    op.drop_index("outboxq_jobs_sequence_idx", table_name="outboxq_jobs")
    op.drop_index("outboxq_jobs_workflow_step_idx", table_name="outboxq_jobs")
    op.drop_column("outboxq_jobs", "sequence")
    op.drop_column("outboxq_jobs", "step")
    op.drop_column("outboxq_jobs", "workflow_id")
    op.drop_table("outboxq_sequences")
    op.drop_index("outboxq_workflows_created_at_idx", table_name="outboxq_workflows")
    op.drop_table("outboxq_workflows")

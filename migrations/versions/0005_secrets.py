"""Secrets shared by every API process (the listing markers' key when none is configured)

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The secrets table."""
    op.create_table(
        "outboxq_secrets",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    """Drop it (API processes without OUTBOXQ_MARKER_SECRET then need one configured)."""
    op.drop_table("outboxq_secrets")

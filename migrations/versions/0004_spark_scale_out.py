"""Spark snapshots leased per driver (issue 15)

Revision ID: 0004
Revises: 0003
"""

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing yet: the issue's work adds its objects here (every name starts with outboxq)."""


def downgrade() -> None:
    """Nothing to undo yet."""

"""Periodic schedules, uniqueness that ends, snooze, timeouts, results and progress (issue 13)

Revision ID: 0002
Revises: 0001
"""

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing yet: the issue's work adds its objects here (every name starts with outboxq)."""


def downgrade() -> None:
    """Nothing to undo yet."""

"""Global and per-key concurrency and rate limits (issue 14)

Revision ID: 0003
Revises: 0002
"""

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing yet: the issue's work adds its objects here (every name starts with outboxq)."""


def downgrade() -> None:
    """Nothing to undo yet."""

"""Shared secrets kept in the database (app/queue/secrets.py)."""

from __future__ import annotations

# The named secret, written with `value` by the first caller; a caller that raced with that first writer gets
# nothing back (the row is not in its snapshot) and reads again.
secret_get_or_create = """
WITH created AS (
    INSERT INTO outboxq_secrets (name, value) VALUES (%(name)s, %(value)s)
    ON CONFLICT (name) DO NOTHING
    RETURNING value
)
SELECT value FROM created
UNION ALL
SELECT value FROM outboxq_secrets WHERE name = %(name)s
LIMIT 1
"""

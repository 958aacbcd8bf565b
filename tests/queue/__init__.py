"""Enqueue, uniqueness, migrations, roles, query plans and the job state machine, on a real PostgreSQL."""

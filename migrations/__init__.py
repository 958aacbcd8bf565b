"""Alembic migrations of the outboxq schema (app/queue/schema.py is their source)."""

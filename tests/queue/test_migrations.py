"""The migrations build exactly the schema that app/queue/schema.py describes."""

from __future__ import annotations

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from outboxq.db import create_engine
from outboxq.queue import migrate
from outboxq.queue.schema import VERSION_TABLE, metadata


def test_migrated_database_matches_the_metadata(db_url):
    engine = create_engine(db_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        diff = compare_metadata(context, metadata)
    engine.dispose()
    assert diff == []


def test_migrated_database_is_at_head_and_has_no_trigger(db_url):
    """At head; since 0007 no trigger on the jobs: the statements that write jobs send their notifications."""
    assert migrate.current_revision(db_url) == migrate.head_revision()
    migrate.ensure_current(db_url)
    with psycopg.connect(db_url) as c:
        trigger = c.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'outboxq_jobs'::regclass AND NOT tgisinternal"
        ).fetchall()
    assert trigger == []


def test_upgrade_is_idempotent(db_url):
    assert migrate.upgrade(db_url) == migrate.head_revision()

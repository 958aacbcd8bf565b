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


def test_0013_moves_the_lease_index_to_the_queue_and_back(db_url):
    """Down to 0012 the lease index is on lease_expires_at alone; up again it is on (queue, lease_expires_at),
    the running jobs written meanwhile in it either way."""
    from alembic import command

    def lease_index() -> str:
        with psycopg.connect(db_url) as c:
            c.execute("INSERT INTO outboxq_jobs (queue, status, payload, lease_token, lease_expires_at, attempts) "
                      "VALUES ('q', 'running', '{}'::jsonb, gen_random_uuid(), now() + interval '1 min', 1)")
            return c.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'outboxq_jobs_lease_idx'").fetchone()[0]

    config = migrate.alembic_config(db_url)
    command.downgrade(config, "0012")
    assert lease_index().endswith("(lease_expires_at) WHERE (status = 'running'::text)")
    assert migrate.upgrade(db_url) == migrate.head_revision()
    assert lease_index().endswith("(queue, lease_expires_at) WHERE (status = 'running'::text)")
    with psycopg.connect(db_url) as c:
        c.execute("SET enable_seqscan = off")
        running = c.execute("SELECT count(*) FROM outboxq_jobs WHERE status = 'running' AND queue = 'q' "
                            "AND lease_expires_at > now()").fetchone()[0]
    assert running == 2

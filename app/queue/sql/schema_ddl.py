"""DDL that outboxq's migrations share (migrations/versions): the SQL text, outside the SQLAlchemy tables of
outboxq.queue.schema."""

from __future__ import annotations

from outboxq.queue.names import NOTIFY_CHANNEL

# The trigger that sent the wake-up notification for new jobs from migration 0001 to 0006 (0007 drops it: the
# statements that write jobs notify, sql.jobs.NOTIFY_IF_READY). Kept for those migrations, up and down.
NOTIFY_FUNCTION_DDL = f"""
CREATE OR REPLACE FUNCTION outboxq_notify_new_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- One notification per queue per statement; PostgreSQL folds duplicates within a transaction.
    PERFORM pg_notify('{NOTIFY_CHANNEL}', q.queue)
      FROM (SELECT DISTINCT queue FROM new_jobs WHERE status = 'queued' AND run_at <= now()) AS q;
    RETURN NULL;
END $$;
"""
NOTIFY_TRIGGER_DDL = """
CREATE TRIGGER outboxq_jobs_notify_new AFTER INSERT ON outboxq_jobs
REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION outboxq_notify_new_jobs();
"""

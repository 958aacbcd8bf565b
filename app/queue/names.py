"""The names and predicates that the schema and the SQL statements share, without SQLAlchemy (the schema's
definition in schema.py needs it; a worker's or the CLI's SQL does not, and imports only this)."""

from __future__ import annotations

# Every table of outboxq's schema (schema.py's metadata defines them; a test keeps the two equal).
TABLES = (
    "outboxq_idempotency_keys", "outboxq_job_dependencies", "outboxq_job_errors", "outboxq_jobs",
    "outboxq_limit_starts", "outboxq_queue_limits", "outboxq_queues", "outboxq_schedules", "outboxq_secrets",
    "outboxq_sequences", "outboxq_spark_batches", "outboxq_spark_drivers", "outboxq_spark_snapshots",
    "outboxq_spark_streams", "outboxq_workers", "outboxq_workflows",
)

JOB_STATUSES = ("waiting", "queued", "running", "retrying", "done", "dead", "cancelled")

# Uniqueness, race-free: a key is held by every 'forever' job and by unfinished 'active' jobs; a finished
# 'active' job leaves the index, so its key can be enqueued again. A 'window' job is not in it: enqueue with a
# window takes a transaction lock on the key and looks for a job with the key created within the window.
KEY_HELD_PREDICATE = (
    "key IS NOT NULL AND (unique_scope = 'forever' "
    "OR (unique_scope = 'active' AND status IN ('waiting', 'queued', 'running', 'retrying')))"
)

# Where `outboxq migrate` records its revision: a table of its own, never the application's alembic_version.
VERSION_TABLE = "outboxq_alembic_version"

NOTIFY_CHANNEL = "outboxq_jobs"
# Sent on NOTIFY_CHANNEL when a running job's cancel is requested (no queue name can contain "!").
CANCEL_NOTICE = "!cancel"

"""SQLAlchemy Core tables: the one source of outboxq's schema (alembic's migrations are checked against it)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from outboxq.queue.names import (  # noqa: F401 - the names are the schema's too
    CANCEL_NOTICE,
    JOB_STATUSES,
    KEY_HELD_PREDICATE,
    NOTIFY_CHANNEL,
    VERSION_TABLE,
)

metadata = MetaData()

_status_list = ", ".join(f"'{s}'" for s in JOB_STATUSES)

jobs = Table(
    "outboxq_jobs",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("queue", Text, nullable=False),
    Column("key", Text),
    Column("status", Text, nullable=False, server_default=text("'queued'")),
    # JSON payloads live in `payload`; a consumer with a custom codec stores its bytes in `payload_bytes`.
    Column("payload", JSONB),
    Column("payload_bytes", LargeBinary),
    Column("priority", SmallInteger, nullable=False, server_default=text("0")),
    Column("run_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    # NULL until the first claim, which fills in the consumer's (or the settings') default.
    Column("max_attempts", Integer),
    Column("lease_token", UUID(as_uuid=True)),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("worker_id", Text),
    Column("last_error", Text),
    Column("last_traceback", Text),
    Column("waiting_reason", Text),
    Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
    Column("context", JSONB),
    # The id of the transaction that enqueued the job: what makes listing markers commit-safe.
    Column("created_xid", BigInteger, nullable=False,
           server_default=text("(pg_current_xact_id())::text::bigint")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("started_at", DateTime(timezone=True)),  # first attempt
    Column("attempt_started_at", DateTime(timezone=True)),  # latest attempt: processing time starts here
    Column("finished_at", DateTime(timezone=True)),
    # Flow control: the key that per-key limits count by, from the consumer's limit_by at enqueue.
    Column("limit_key", Text),
    # How long the job's key blocks another job with the same key (enqueue's `unique`): 'forever' while the
    # row exists, 'active' while it is unfinished; 'window' (unique=timedelta) is checked at enqueue.
    Column("unique_scope", Text, nullable=False, server_default=text("'forever'")),
    # What a waiting job does when a dependency ends dead or cancelled: 'wait', 'cancel' or 'run'.
    Column("on_dependency_failure", Text, nullable=False, server_default=text("'wait'")),
    # Times a handler snoozed the job (outboxq.Snooze): each one gave its attempt back.
    Column("snoozes", Integer, nullable=False, server_default=text("0")),
    # The handler's JSON return value, and the progress it reported while running (ctx.set_progress).
    Column("result", JSONB),
    Column("progress", Float),
    Column("progress_message", Text),
    # A workflow's step (outboxq.Workflow): the workflow's id and the step's name, unique within it.
    Column("workflow_id", BigInteger),
    Column("step", Text),
    # enqueue(sequence=...): the jobs of one sequence run one at a time, in enqueue order.
    Column("sequence", Text),
    CheckConstraint(f"status IN ({_status_list})", name="outboxq_jobs_status_check"),
    CheckConstraint("max_attempts IS NULL OR max_attempts >= 0", name="outboxq_jobs_max_attempts_check"),
    CheckConstraint("unique_scope IN ('forever', 'active', 'window')", name="outboxq_jobs_unique_scope_check"),
    CheckConstraint("on_dependency_failure IN ('wait', 'cancel', 'run')",
                    name="outboxq_jobs_on_dependency_failure_check"),
    CheckConstraint("progress IS NULL OR (progress >= 0 AND progress <= 1)", name="outboxq_jobs_progress_check"),
)

# The claim index matches the claim query exactly: only claimable rows, in claim order.
Index(
    "outboxq_jobs_claim_idx",
    jobs.c.queue, jobs.c.priority, jobs.c.run_at, jobs.c.id,
    postgresql_where=text("status = 'queued'"),
)
Index(
    "outboxq_jobs_retry_idx",
    jobs.c.queue, jobs.c.run_at, jobs.c.id,
    postgresql_where=text("status = 'retrying'"),
)
# The running jobs (migration 0013): a limited queue's claim counts its own; the rescue reads the expired leases
# of every queue.
Index(
    "outboxq_jobs_lease_idx",
    jobs.c.queue, jobs.c.lease_expires_at,
    postgresql_where=text("status = 'running'"),
)
# Finding jobs by key (depends_on, on_conflict="ignore"), whatever their uniqueness.
Index(
    "outboxq_jobs_key_idx", jobs.c.queue, jobs.c.key,
    postgresql_where=text("key IS NOT NULL"),
)
# Uniqueness, race-free: the key index holds a job while KEY_HELD_PREDICATE (names.py) says its key is held.
Index(
    "outboxq_jobs_key_unique_idx", jobs.c.queue, jobs.c.key, unique=True,
    postgresql_where=text(KEY_HELD_PREDICATE),
)
# The listing feed (app/queue/feed.py) pages in (created_xid, id) order within a queue; its running jobs are read
# through the lease index (sql.job_feed_page), so that a claim writes no entry here (migration 0012).
Index(
    "outboxq_jobs_feed_idx", jobs.c.queue, jobs.c.created_xid, jobs.c.id,
    postgresql_where=text("status <> 'running'"),
)
Index(
    "outboxq_jobs_finished_idx", jobs.c.finished_at,
    postgresql_where=text("status IN ('done', 'dead', 'cancelled')"),
)
Index(
    "outboxq_jobs_waiting_idx", jobs.c.queue,
    postgresql_where=text("status = 'waiting'"),
)

# Per-key claims (flow control): the distinct keys of a queue's claimable jobs, and each key's jobs in claim
# order. Jobs without a limit key (every queue without limit_by) are not in it: they cost it nothing.
Index(
    "outboxq_jobs_limit_key_idx",
    jobs.c.queue, jobs.c.limit_key, jobs.c.priority, jobs.c.run_at, jobs.c.id,
    postgresql_where=text("status IN ('queued', 'retrying') AND limit_key IS NOT NULL"),
)

# A workflow's steps, and the step of a name (unique: two steps of one workflow never share a name).
Index("outboxq_jobs_workflow_step_idx", jobs.c.workflow_id, jobs.c.step, unique=True,
      postgresql_where=text("workflow_id IS NOT NULL"))
# A sequence's newest job (its next job's predecessor).
Index("outboxq_jobs_sequence_idx", jobs.c.sequence, jobs.c.id, postgresql_where=text("sequence IS NOT NULL"))

job_errors = Table(
    "outboxq_job_errors",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("job_id", BigInteger, ForeignKey("outboxq_jobs.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("error", Text, nullable=False),
    Column("traceback", Text),
    Column("failed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # 'error' for a failed attempt (timeouts and rescues included), 'snooze' for a handler's Snooze.
    Column("kind", Text, nullable=False, server_default=text("'error'")),
    Column("worker_id", Text),  # the worker process that ran the attempt (the dashboard's timeline)
    CheckConstraint("kind IN ('error', 'snooze')", name="outboxq_job_errors_kind_check"),
)
Index("outboxq_job_errors_job_idx", job_errors.c.job_id)
Index("outboxq_job_errors_failed_at_idx", job_errors.c.failed_at)  # the throughput chart's window

# Periodic schedules (outboxq.periodic): one row per schedule name, written by the workers that define it.
# A slot is claimed by moving last_slot forward under the row's lock, and its job's key
# (periodic:{name}:{slot}) makes a second job for one slot impossible.
schedules = Table(
    "outboxq_schedules",
    metadata,
    Column("name", Text, primary_key=True),
    Column("queue", Text, nullable=False),
    Column("spec", Text, nullable=False),  # "cron:<expression>" or "every:<seconds>"
    Column("timezone", Text, nullable=False),
    Column("missed", Text, nullable=False),
    Column("payload", JSONB),
    Column("last_slot", DateTime(timezone=True)),
    Column("next_slot", DateTime(timezone=True), nullable=False),
    Column("last_job_id", BigInteger),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # An operator paused it: no slot is enqueued until it is resumed (then its missed policy applies).
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint("missed IN ('latest', 'skip', 'all')", name="outboxq_schedules_missed_check"),
)

job_dependencies = Table(
    "outboxq_job_dependencies",
    metadata,
    Column("job_id", BigInteger, ForeignKey("outboxq_jobs.id", ondelete="CASCADE"), nullable=False),
    # No foreign key: a finished dependency may be pruned before (or after) its dependent.
    Column("depends_on_id", BigInteger, nullable=False),
    # What the dependent does when this dependency ends dead or cancelled, where it differs from the job's own
    # on_dependency_failure: 'cancel', 'run', or 'sequence' (a sequence's link: held while the job before is
    # dead, released once it is done or cancelled).
    Column("on_failure", Text),
    CheckConstraint("on_failure IN ('wait', 'cancel', 'run', 'sequence')",
                    name="outboxq_job_dependencies_on_failure_check"),
    PrimaryKeyConstraint("job_id", "depends_on_id", name="outboxq_job_dependencies_pkey"),
)
Index("outboxq_job_dependencies_depends_on_idx", job_dependencies.c.depends_on_id)

# The live workers: each worker process announces itself at start and every few seconds from its heartbeat
# (outboxq.workers.heartbeat), and forgets itself when it stops; one killed outright lapses (its last_seen_at
# grows old) and leaves the listing, and maintenance deletes it a day later.
workers = Table(
    "outboxq_workers",
    metadata,
    Column("id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", Text, nullable=False),
    Column("queues", JSONB, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("in_flight", Integer, nullable=False, server_default=text("0")),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
Index("outboxq_workers_last_seen_at_idx", workers.c.last_seen_at)

# A sequence's newest job (enqueue(sequence=...)): the next job of the sequence comes after it. Enqueuers of one
# sequence take turns on its row (an upsert), so that each sees the one before.
sequences = Table(
    "outboxq_sequences",
    metadata,
    Column("sequence", Text, primary_key=True),
    Column("last_job_id", BigInteger),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# A workflow (outboxq.Workflow): its steps are jobs with its id; its status is read from theirs.
workflows = Table(
    "outboxq_workflows",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("name", Text, nullable=False),
    Column("steps", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("cancelled_at", DateTime(timezone=True)),
)
Index("outboxq_workflows_created_at_idx", workflows.c.created_at)

queues = Table(
    "outboxq_queues",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("paused_at", DateTime(timezone=True)),
    # Set at a queue's first failure after a success, cleared by its next success: the queue is in error.
    Column("failing_since", DateTime(timezone=True)),
    Column("consecutive_failures", Integer, nullable=False, server_default=text("0")),
    Column("last_success_at", DateTime(timezone=True)),
)

# Flow control: a queue's limits, changeable at run time. `source` is 'consumer' when the row comes
# from a @consumer's options (a worker rewrites it at start) and 'operator' once `outboxq queues limit` set
# it (workers leave it alone then).
queue_limits = Table(
    "outboxq_queue_limits",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("global_concurrency", Integer),
    Column("rate_limit_count", Integer),
    Column("rate_limit_period_s", Float),
    Column("per_key", Boolean, nullable=False, server_default=text("false")),
    Column("source", Text, nullable=False, server_default=text("'consumer'")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("global_concurrency IS NULL OR global_concurrency >= 0",
                    name="outboxq_queue_limits_global_concurrency_check"),
    CheckConstraint("(rate_limit_count IS NULL) = (rate_limit_period_s IS NULL) "
                    "AND (rate_limit_count IS NULL OR (rate_limit_count >= 0 AND rate_limit_period_s > 0))",
                    name="outboxq_queue_limits_rate_limit_check"),
    CheckConstraint("source IN ('consumer', 'operator')", name="outboxq_queue_limits_source_check"),
)

# The starts of rate-limited queues (a sliding-window log): one row per claim and key, with how many jobs it
# started; rows older than the queue's period are deleted by the claims themselves.
limit_starts = Table(
    "outboxq_limit_starts",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("queue", Text, nullable=False),
    Column("limit_key", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("starts", Integer, nullable=False),
)
Index("outboxq_limit_starts_queue_idx", limit_starts.c.queue, limit_starts.c.started_at)

idempotency_keys = Table(
    "outboxq_idempotency_keys",
    metadata,
    Column("key", Text, nullable=False),
    Column("scope", Text, nullable=False),
    Column("request_hash", Text, nullable=False),
    Column("response_status", Integer, nullable=False),
    Column("response_body", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("scope", "key", name="outboxq_idempotency_keys_pkey"),
)

# Spark consumers (Cues-style exactly-once): one row per driver, its fencing epoch. Many drivers of one
# processor run at once; restarting a driver with the same id bumps the epoch and fences its predecessor.
spark_drivers = Table(
    "outboxq_spark_drivers",
    metadata,
    Column("driver_id", Text, primary_key=True),
    Column("processor_id", Text, nullable=False),
    Column("epoch", BigInteger, nullable=False, server_default=text("0")),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# A claimed batch. Its driver holds it under lease_token until lease_expires_at (renewed while it works);
# once that lapses another driver of the processor adopts it with a new token and epoch + 1.
spark_snapshots = Table(
    "outboxq_spark_snapshots",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("processor_id", Text, nullable=False),
    Column("queue", Text, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("job_ids", JSONB, nullable=False),
    Column("lease_token", UUID(as_uuid=True), nullable=False),
    Column("delivery_hash", Text, nullable=False),
    Column("output_table", Text, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'claimed'")),
    Column("rows_written", Integer),
    Column("error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("delivered_at", DateTime(timezone=True)),
    Column("driver_id", Text),
    Column("lease_expires_at", DateTime(timezone=True)),
    UniqueConstraint("delivery_hash", name="outboxq_spark_snapshots_delivery_hash_key"),
    CheckConstraint("state IN ('claimed', 'delivered', 'failed')", name="outboxq_spark_snapshots_state_check"),
)
Index("outboxq_spark_snapshots_pending_idx", spark_snapshots.c.processor_id,
      postgresql_where=text("state = 'claimed'"))

# A Spark streaming query reading a queue through the "outboxq" data source (spark_jobs.datasource): its
# micro-batches are snapshots of processor "stream:<name>"; the row says where it runs and how far it got.
spark_streams = Table(
    "outboxq_spark_streams",
    metadata,
    Column("name", Text, primary_key=True),
    Column("queue", Text, nullable=False),
    Column("application_id", Text),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("micro_batches", BigInteger, nullable=False, server_default=text("0")),
    Column("jobs_read", BigInteger, nullable=False, server_default=text("0")),
    Column("lease_renewals", BigInteger, nullable=False, server_default=text("0")),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("stopped_at", DateTime(timezone=True)),
)

spark_batches = Table(
    "outboxq_spark_batches",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("queue", Text, nullable=False),
    Column("processor", Text, nullable=False),
    Column("output_table", Text, nullable=False),
    Column("batch_size", Integer, nullable=False),
    Column("master", Text),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    Column("jobs_claimed", Integer, nullable=False, server_default=text("0")),
    Column("rows_written", Integer, nullable=False, server_default=text("0")),
    Column("error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    CheckConstraint("state IN ('pending', 'running', 'done', 'failed')", name="outboxq_spark_batches_state_check"),
)

# Secrets every API process shares: the listing markers' HMAC key when OUTBOXQ_MARKER_SECRET is not set, made
# by the first process that needs it, so markers survive restarts and agree across processes.
secrets = Table(
    "outboxq_secrets",
    metadata,
    Column("name", Text, primary_key=True),
    Column("value", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

"""Statements on outboxq_jobs and its dependency and history tables: enqueue, claim, complete, fail, snooze,
heartbeat, the listing, and the operators' actions on one job. CLAIM_SET and RELEASE_SET are the fragments
every claim and release shares (Spark's too)."""

from __future__ import annotations

from outboxq.queue.names import CANCEL_NOTICE, KEY_HELD_PREDICATE, NOTIFY_CHANNEL

# A job's columns, in this order; `result` named apart so that the listing can leave it out (_FEED_COLUMNS).
_COLUMNS_BEFORE_RESULT = (
    "id, queue, key, status, payload, payload_bytes, priority, run_at, attempts, max_attempts, "
    "last_error, last_traceback, waiting_reason, cancel_requested, context, created_at, started_at, "
    "attempt_started_at, finished_at, worker_id, unique_scope, on_dependency_failure, snoozes"
)
_COLUMNS_AFTER_RESULT = "progress, progress_message, workflow_id, step, sequence"
JOB_COLUMNS = f"{_COLUMNS_BEFORE_RESULT}, result, {_COLUMNS_AFTER_RESULT}"
# The same without the result (a listing's: results may be large).
JOB_COLUMNS_NO_RESULT = f"{_COLUMNS_BEFORE_RESULT}, NULL::jsonb AS result, {_COLUMNS_AFTER_RESULT}"

# A job written ready to run wakes the workers of its queue: a notification sent at COMMIT (none on rollback;
# PostgreSQL folds a transaction's repeats), in the statement that writes the job. The AFTER INSERT trigger that
# did this until migration 0007 (plpgsql over a transition table, once per statement) cost many times what this
# expression costs (bench/wakeup_and_notify.py measures both).
NOTIFY_IF_READY = f"CASE WHEN status = 'queued' AND run_at <= now() THEN pg_notify('{NOTIFY_CHANNEL}', queue)::text END"

# A key held by another job (schema.KEY_HELD_PREDICATE) makes the insert do nothing: no row comes back.
job_insert = f"""
INSERT INTO outboxq_jobs
    (queue, key, status, payload, payload_bytes, priority, run_at, max_attempts, context, waiting_reason,
     limit_key, unique_scope, on_dependency_failure, finished_at, sequence)
VALUES (%(queue)s, %(key)s, %(status)s, %(payload)s, %(payload_bytes)s, %(priority)s,
        coalesce(%(run_at)s::timestamptz, now() + %(delay)s::float8 * interval '1 second'),
        %(max_attempts)s, %(context)s, %(waiting_reason)s, %(limit_key)s, %(unique_scope)s,
        %(on_dependency_failure)s, CASE WHEN %(status)s = 'cancelled' THEN now() END, %(sequence)s)
ON CONFLICT (queue, key) WHERE {KEY_HELD_PREDICATE} DO NOTHING
RETURNING id, status, run_at, created_at, {NOTIFY_IF_READY} AS notified
"""

# Many jobs of one queue in one statement; rows come back in input order (ORDER BY ordinality).
job_insert_many = f"""
INSERT INTO outboxq_jobs
    (queue, key, status, payload, payload_bytes, priority, run_at, max_attempts, context, limit_key,
     unique_scope)
SELECT %(queue)s, i.key, 'queued', i.payload, i.payload_bytes, %(priority)s,
       coalesce(%(run_at)s::timestamptz, now() + %(delay)s::float8 * interval '1 second'),
       %(max_attempts)s, %(context)s, i.limit_key, %(unique_scope)s
FROM unnest(%(keys)s::text[], %(payloads)s::jsonb[], %(payloads_bytes)s::bytea[], %(limit_keys)s::text[])
     WITH ORDINALITY AS i(key, payload, payload_bytes, limit_key, ord)
ORDER BY i.ord
ON CONFLICT (queue, key) WHERE {KEY_HELD_PREDICATE} DO NOTHING
RETURNING id, key, status, run_at, created_at, {NOTIFY_IF_READY} AS notified
"""

# Key-less enqueue_many goes through COPY (much faster than the INSERT above): first reserve the
# ids (COPY cannot return them) and read the transaction's clock for run_at and created_at. The sequence is
# looked up once, in a materialized CTE: written inside nextval() (or in a subquery the planner pulls up) it is
# looked up for every id, which made this statement several times slower on a large batch.
job_reserve_ids = """
WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence('outboxq_jobs', 'id')::regclass AS seq)
SELECT array(SELECT nextval(s.seq) FROM s, generate_series(1, %(n)s)) AS ids,
       now() AS now
"""

# The columns a key-less enqueue_many may send, in the order it sends them. id, queue and payload always; the
# others only when a job's value is not the column's default (status 'queued', priority 0, run_at and
# created_at now(), the rest NULL): each column sent costs its text in every row and its parsing on the server.
JOB_COPY_COLUMNS = ("id", "queue", "payload", "payload_bytes", "priority", "run_at", "max_attempts", "context",
                    "created_at", "limit_key")


# After a COPY of jobs ready to run (COPY returns nothing to notify from): wake the queue's workers.
job_notify_ready = f"SELECT pg_notify('{NOTIFY_CHANNEL}', %(queue)s)"

# The worker's listener (outboxq.workers.listener): the new-work and cancel notifications of every queue.
job_notifications_listen = f"LISTEN {NOTIFY_CHANNEL}"


def job_copy(columns: tuple[str, ...]) -> str:
    """COPY ... FROM STDIN of these columns of outboxq_jobs (a subset of JOB_COPY_COLUMNS, in its order)."""
    if any(c not in JOB_COPY_COLUMNS for c in columns):
        raise ValueError(f"not a column enqueue_many copies: {columns!r}")
    return f"COPY outboxq_jobs ({', '.join(columns)}) FROM STDIN"

job_delete_by_ids = "DELETE FROM outboxq_jobs WHERE id = ANY(%(ids)s::bigint[])"

# enqueue_many with keys, inside the caller's transaction: a refused call rolls back to this savepoint.
enqueue_savepoint = "SAVEPOINT outboxq_enqueue_many"

enqueue_savepoint_rollback = "ROLLBACK TO SAVEPOINT outboxq_enqueue_many"

enqueue_savepoint_release = "RELEASE SAVEPOINT outboxq_enqueue_many"

# The newest job of each (queue, key) pair (a key that is not unique forever may have several jobs).
job_find_by_keys = """
SELECT DISTINCT ON (j.queue, j.key) j.id, j.queue, j.key, j.status
FROM outboxq_jobs j
JOIN unnest(%(queues)s::text[], %(keys)s::text[]) AS wanted(queue, key)
  ON j.queue = wanted.queue AND j.key = wanted.key
ORDER BY j.queue, j.key, j.id DESC
"""

# Uniqueness within a window (unique=timedelta): the keys of this call are locked until the transaction ends
# (in a fixed order, so two callers cannot deadlock), then the jobs created with them within the window read.
UNIQUE_KEY_LOCK_CLASS = 7002

job_key_lock = f"""
SELECT count(pg_advisory_xact_lock({UNIQUE_KEY_LOCK_CLASS}, hashtext(%(queue)s || E'\\n' || k.key))) AS locked
FROM (SELECT DISTINCT unnest(%(keys)s::text[]) AS key ORDER BY 1) AS k
"""

job_find_recent_by_keys = f"""
SELECT DISTINCT ON (key) {JOB_COLUMNS} FROM outboxq_jobs
WHERE queue = %(queue)s AND key = ANY(%(keys)s::text[])
  AND created_at > now() - %(window_s)s::float8 * interval '1 second'
ORDER BY key, id DESC
"""

# The job that holds each key (what made an insert do nothing).
job_find_key_holders = f"""
SELECT DISTINCT ON (key) {JOB_COLUMNS} FROM outboxq_jobs
WHERE queue = %(queue)s AND key = ANY(%(keys)s::text[]) AND {KEY_HELD_PREDICATE}
ORDER BY key, id DESC
"""

job_dependencies_insert = """
INSERT INTO outboxq_job_dependencies (job_id, depends_on_id)
SELECT %(job_id)s, unnest(%(depends_on_ids)s::bigint[])
"""

job_get = f"SELECT {JOB_COLUMNS} FROM outboxq_jobs WHERE id = %(id)s"

# When the current transaction began (its now()): a job created before it was not written by it.
transaction_started_at = "SELECT now() AS now"

# A COMMIT sent as a statement in a pipeline, so that the caller works while the server commits (an API write
# renders its answer meanwhile) and reads the outcome as the pipeline ends.
transaction_commit = "COMMIT"

# What every claim sets on a job it takes (workers' batch and by-id claims, flow control's claims through
# job_claim_batch, Spark's snapshot claim): running, one more attempt, a lease under the claimer's token.
CLAIM_SET = """SET status = 'running',
    attempts = j.attempts + 1,
    max_attempts = coalesce(j.max_attempts, %(default_max_attempts)s),
    lease_token = %(lease_token)s,
    lease_expires_at = now() + %(lease_s)s::float8 * interval '1 second',
    worker_id = %(worker_id)s,
    started_at = coalesce(j.started_at, now()),
    attempt_started_at = now()"""

# What a release sets: a claimed job that was never worked on goes back to the queue, its attempt undone
# (a stopping worker's unstarted jobs, a Spark snapshot that cannot be delivered any more). Its run_at stays:
# it keeps its place ahead of the jobs enqueued since (a claim from the front finds it: claim_cursor).
RELEASE_SET = """SET status = CASE WHEN j.attempts > 1 THEN 'retrying' ELSE 'queued' END,
    attempts = j.attempts - 1, lease_token = NULL, lease_expires_at = NULL"""

# What an operator's retry sets: the job runs again now; a job out of attempts gets exactly one more, so
# attempts never exceed max_attempts (one job's retry, or every failed job of a queue).
# What an operator's cancel sets: a running job is only asked to stop (the notification, CANCEL_NOTICE, wakes
# every worker's heartbeat, and the one holding the job stops its handler at once); the others end cancelled.
CANCEL_SET = """SET status = CASE WHEN status = 'running' THEN status ELSE 'cancelled' END,
        finished_at = CASE WHEN status = 'running' THEN finished_at ELSE now() END,
        cancel_requested = true"""
CANCELLABLE = "('queued', 'waiting', 'retrying', 'running', 'dead')"
RETRIABLE = "('retrying', 'dead', 'cancelled')"

RETRY_SET = """SET status = 'queued', run_at = now(), finished_at = NULL, cancel_requested = false,
        max_attempts = CASE WHEN max_attempts <> 0 AND attempts >= max_attempts THEN attempts + 1
                            ELSE max_attempts END"""

# Where a claim's scan of the claim index starts (outboxq.workers.claim_cursor): after the last job this
# worker's previous claim of the queue took, or (all NULL) at the front. While an old snapshot holds back
# vacuum, the entries of every job claimed so far stay at the front of the index, and a scan from the front
# walks them all on every claim (the drain slowed to half). The sentinels are below any job (ids
# start at 1), and stay an index condition in a generic plan as well.
CLAIM_CURSOR = ("coalesce(%(after_priority)s::smallint, -32768), coalesce(%(after_run_at)s::timestamptz, "
                "'-infinity'), coalesce(%(after_id)s::bigint, 0)")

# An unlimited claim's commit does not wait for its WAL to reach the disk (a commit several times cheaper, on
# the path from enqueue to handler start). A claim lost in a server crash leaves its jobs as they
# were before it: they run again, at least once, as after a worker's death (the lost lease token fences the
# late completion out). A completion commits synchronously and so makes the claims before it durable. Limited
# claims keep synchronous commit: their counts and start log must survive a crash.
# The dispatcher's connection is in autocommit with this session setting, so that an unlimited claim is one
# statement in one round trip: no BEGIN, SET, COMMIT and pipeline Sync around it. What
# must be durable there (a limited claim, the declared limits) turns synchronous commit on for its transaction;
# a claim in a caller's transaction sets it off for that transaction only.
claims_session_async = "SET synchronous_commit = off"
claim_commit_async = "SET LOCAL synchronous_commit = off"
claim_commit_sync = "SET LOCAL synchronous_commit = on"

# Generic plans without sequential scans: "false" for the session, "true" for the rest of the transaction. A
# generic plan is made once per prepared statement (psycopg prepares from the sixth run; the worker's own
# connections from the first, WorkerState._connect_with) and kept until the table's statistics change
# (autovacuum); the statements that run under it find their jobs through indexes, and sequential scans are
# priced out so that a plan made over an empty or tiny table (where a scan is cheapest) still reads the indexes
# once the table has grown.
generic_plans = ("SELECT set_config('plan_cache_mode', 'force_generic_plan', {local}), "
                 "set_config('enable_seqscan', 'off', {local})")
# The dispatcher's and the completer's connections: their claims and writes are planned once per connection.
# Left to plan_cache_mode "auto", PostgreSQL planned an unlimited claim anew at every claim, and the completion
# of a few jobs at every write (nearly half its cost; a global_concurrency=4 drain writes one or two outcomes at
# a time).
session_generic_plans = generic_plans.format(local="false")

# The parts of job_claim_batch, which the claims of limited queues (sql.limits) are built from as well, so that
# the limited and the unlimited claims cannot drift apart: the queue_state CTE (paused, failing); the fresh and
# retry CTEs, which pick at most {limit} jobs (a template: "%(limit)s" in job_claim_batch, the queue's allowance
# in sql.limits); and the UPDATE ... RETURNING that claims the picked jobs.
CLAIM_QUEUE_STATE = """queue_state AS (
    SELECT coalesce(bool_or(paused), false) AS paused,
           coalesce(bool_or(failing_since IS NOT NULL), false) AS failing
    FROM outboxq_queues WHERE queue = %(queue)s
)"""

CLAIM_CANDIDATES = f"""fresh AS (
    SELECT id FROM outboxq_jobs
    WHERE queue = %(queue)s AND status = 'queued' AND run_at <= now()
      AND (priority, run_at, id) > ({CLAIM_CURSOR})
      AND NOT (SELECT paused FROM queue_state)
    ORDER BY priority, run_at, id
    LIMIT {{limit}}
    FOR UPDATE SKIP LOCKED
),
retry AS (
    SELECT id FROM outboxq_jobs
    WHERE queue = %(queue)s AND status = 'retrying' AND run_at <= now()
      AND NOT (SELECT paused FROM queue_state)
      AND (NOT (SELECT failing FROM queue_state)
           OR NOT EXISTS (SELECT 1 FROM outboxq_jobs r
                          WHERE r.status = 'running' AND r.queue = %(queue)s AND r.attempts > 1))
    ORDER BY run_at, id
    LIMIT greatest(0, least(CASE WHEN (SELECT failing FROM queue_state) THEN 1 ELSE {{limit}} END,
                            {{limit}} - (SELECT count(*) FROM fresh)))
    FOR UPDATE SKIP LOCKED
)"""

CLAIM_UPDATE = f"""UPDATE outboxq_jobs j
{CLAIM_SET}
WHERE j.id = ANY(ARRAY(SELECT id FROM fresh UNION ALL SELECT id FROM retry))
RETURNING j.id, j.queue, j.key, j.payload, j.payload_bytes, j.attempts, j.max_attempts, j.context,
          j.priority, j.run_at, (SELECT failing FROM queue_state) AS queue_failing"""

# One statement: read the queue's state (paused, failing), lock fresh jobs with SKIP LOCKED, and while the
# queue is failing take at most one retrying job (and none while another retry is in flight), so that a
# downstream that is down sees one probe at a time instead of every retry at once. The picked ids go to the
# UPDATE as an array: a join would let the planner hash-join a sequential scan of the whole table.
job_claim_batch = f"""
WITH {CLAIM_QUEUE_STATE},
{CLAIM_CANDIDATES.format(limit="%(limit)s")}
{CLAIM_UPDATE}
"""

# Claim one given job (test helpers run a chosen job deterministically); same columns as job_claim_batch.
job_claim_by_id = f"""
UPDATE outboxq_jobs j
{CLAIM_SET}
WHERE j.id = %(id)s AND j.queue = %(queue)s AND j.status IN ('queued', 'retrying') AND %(limit)s > 0
RETURNING j.id, j.queue, j.key, j.payload, j.payload_bytes, j.attempts, j.max_attempts, j.context,
          j.priority, j.run_at,
          coalesce((SELECT q.failing_since IS NOT NULL FROM outboxq_queues q WHERE q.queue = j.queue), false)
              AS queue_failing
"""

# Complete many jobs at once, each fenced by its own lease token, and release the waiting jobs whose last
# dependency just finished (notifying their queues). Returns the ids that were completed; an id missing
# from the result was fenced (its lease was taken away). Rows are found by primary key (id = ANY) and each
# one's token looked up in a jsonb object built once (a binary search): otherwise the planner may scan the
# whole lease index (status = 'running'), whose dead entries (every job that ran since the last vacuum)
# make each completion slower than the last during a long drain, or loop over the pairs for every row.
JOB_COMPLETE_CTES = """done AS (
    UPDATE outboxq_jobs j
    SET status = 'done', finished_at = now(), lease_token = NULL, lease_expires_at = NULL{also_set}
    WHERE j.id = ANY(%(ids)s::bigint[])
      AND {fence}
      AND (j.status = 'running') IS TRUE  -- written so that the lease index's predicate does not match
    RETURNING j.id
),
released AS (
    UPDATE outboxq_jobs w
    SET status = 'queued', waiting_reason = NULL
    -- (Written as one IS TRUE test, the status matches no partial index's predicate: a generic plan made while
    -- the table was empty read the feed index whole for each dependent instead of the primary key.)
    WHERE (w.status = 'waiting') IS TRUE
      AND w.id IN (SELECT d.job_id FROM outboxq_job_dependencies d JOIN done ON d.depends_on_id = done.id)
      AND NOT EXISTS (
          SELECT 1 FROM outboxq_job_dependencies d2
          JOIN outboxq_jobs dep ON dep.id = d2.depends_on_id
          WHERE d2.job_id = w.id AND (dep.status <> 'done' OR dep.lease_token IS NOT NULL)
            AND dep.id NOT IN (SELECT id FROM done))
    RETURNING w.queue
)"""
# The queues of the jobs released above are woken (the notifications are sent at commit).
JOB_COMPLETE_NOTIFY = (f"SELECT NULL FROM (SELECT DISTINCT queue FROM released) AS q, "
                       f"pg_notify('{NOTIFY_CHANNEL}', q.queue)")
_JOB_COMPLETE = "\nWITH " + JOB_COMPLETE_CTES + "\nSELECT id FROM done\nUNION ALL\n" + JOB_COMPLETE_NOTIFY + "\n"
# Each job fenced by its own token (a worker's completions; flow control's too, limits_sql).
FENCE_BY_TOKENS = ("j.lease_token = ((SELECT jsonb_object(%(ids)s::bigint[]::text[], %(lease_tokens)s::uuid[]::text[]))"
                   "\n                           ->> j.id::text)::uuid")
# The one-row answer of a worker's completions (and of limits_sql.job_complete_handing_over's): the ids completed
# as one array, and the queues woken. A row a job cost the completer a Python dict a job.
JOB_COMPLETE_ANSWER = ("SELECT (SELECT array_agg(id) FROM done) AS completed_ids,\n"
                       "       (SELECT count(*) FROM (" + JOB_COMPLETE_NOTIFY + ") n) AS released_queues")
job_complete_batch = ("\nWITH " + JOB_COMPLETE_CTES.format(fence=FENCE_BY_TOKENS, also_set="") + "\n"
                      + JOB_COMPLETE_ANSWER + "\n")

# The same for jobs that share one lease token (a Spark snapshot's): no per-job lookup, and one token sent
# instead of one per job. Each job's result is the delivery's summary (so a Spark batch that is a workflow's
# step hands it to the steps after it).
job_complete_one_lease = _JOB_COMPLETE.format(fence="j.lease_token = %(lease_token)s::uuid",
                                              also_set=", result = %(result)s::jsonb")

# ctx.transaction()'s completion, refused once the lease has expired as well. That transaction holds the job's
# row lock from its start (job_lock_if_leased), so no rescue can take the job meanwhile: a worker frozen inside
# it past its lease (a zombie) would otherwise commit its effects after its slot went to another job, over
# a concurrency limit. It releases no dependent, and the job keeps its lease token: the handler's result is
# only known once the handler returns, after this commits, and a step's dependents must see it
# (ctx.parent_results). A done job that still has its token is "settling": no release counts it as done until
# the completer stores its result and clears the token (job_settle_in_transaction, then
# job_release_dependents), or, where the worker died in between, until its lease would have expired.
job_complete_in_lease = """
UPDATE outboxq_jobs j
SET status = 'done', finished_at = now()
WHERE j.id = ANY(%(ids)s::bigint[])
  AND j.lease_token = %(lease_token)s::uuid AND j.lease_expires_at > clock_timestamp()
  AND (j.status = 'running') IS TRUE
RETURNING j.id
"""

# The same, with the result the handler gave inside the block (ctx.set_result): stored in the same commit as
# its effects, the token cleared and the dependents released at once, so nothing can come between them.
job_complete_in_lease_with_result = _JOB_COMPLETE.format(
    fence="j.lease_token = %(lease_token)s::uuid AND j.lease_expires_at > clock_timestamp()",
    also_set=", result = %(result)s::jsonb")

# Jobs done in ctx.transaction() settle: their results stored (where they returned one), their tokens cleared.
job_settle_in_transaction = """
UPDATE outboxq_jobs j
SET result = coalesce(r.result, j.result), lease_token = NULL, lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[], %(results)s::jsonb[]) AS r(id, lease_token, result)
WHERE j.id = r.id AND j.status = 'done' AND j.lease_token = r.lease_token
"""

# The waiting jobs whose last dependency is among these done jobs become queued, their queues woken.
job_release_dependents = f"""
WITH released AS (
    UPDATE outboxq_jobs w
    SET status = 'queued', waiting_reason = NULL
    WHERE (w.status = 'waiting') IS TRUE  -- (by primary key: JOB_COMPLETE_CTES says why)
      AND w.id IN (SELECT d.job_id FROM outboxq_job_dependencies d WHERE d.depends_on_id = ANY(%(ids)s::bigint[]))
      AND NOT EXISTS (
          SELECT 1 FROM outboxq_job_dependencies d2
          JOIN outboxq_jobs dep ON dep.id = d2.depends_on_id
          WHERE d2.job_id = w.id AND (dep.status <> 'done' OR dep.lease_token IS NOT NULL))
    RETURNING w.queue
)
{JOB_COMPLETE_NOTIFY}
"""

# Fail jobs, each fenced by its own lease token, with the fate its retry policy decided in Python
# (RetryPolicy.decide: 'retrying' after `delays` seconds, or 'dead'); each error goes to its job's history.
# The queue is marked failing (one consecutive failure per job) unless mark_failing is false: a handled
# error moved to an error queue says nothing about the downstream. Workers and Spark (a delivery's failed
# jobs, a failed batch, jobs moved to an error queue) all fail jobs through this one statement.
job_fail_batch = """
WITH decided AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[], %(statuses)s::text[],
                         %(delays)s::float8[], %(errors)s::text[], %(tracebacks)s::text[])
           AS d(id, lease_token, status, delay, error, traceback)
),
failed AS (
    UPDATE outboxq_jobs j
    SET status = d.status,
        run_at = CASE WHEN d.status = 'retrying' THEN now() + d.delay * interval '1 second' ELSE j.run_at END,
        finished_at = CASE WHEN d.status = 'dead' THEN now() END,
        last_error = d.error, last_traceback = d.traceback,
        lease_token = NULL, lease_expires_at = NULL
    FROM decided d
    WHERE j.id = d.id AND j.lease_token = d.lease_token
      AND (j.status = 'running') IS TRUE  -- by primary key, as job_complete_batch (not the lease index)
    RETURNING j.id, j.queue, j.attempts, j.status, d.error, d.traceback, j.worker_id
),
history AS (
    INSERT INTO outboxq_job_errors (job_id, attempt, error, traceback, worker_id)
    SELECT id, attempts, error, traceback, worker_id FROM failed
),
queue_failing AS (
    INSERT INTO outboxq_queues (queue, failing_since, consecutive_failures)
    SELECT queue, now(), count(*) FROM failed WHERE %(mark_failing)s GROUP BY queue
    ON CONFLICT (queue) DO UPDATE
    SET failing_since = coalesce(outboxq_queues.failing_since, now()),
        consecutive_failures = outboxq_queues.consecutive_failures + EXCLUDED.consecutive_failures
)
SELECT id, status FROM failed
"""

# A handler's Snooze, fenced: back to the queue after `delay` seconds with its attempt given back (attempts
# counts attempts, not snoozes), and the snooze in the job's history.
job_snooze = """
WITH snoozed AS (
    UPDATE outboxq_jobs
    SET status = 'queued', run_at = now() + %(delay)s::float8 * interval '1 second',
        attempts = attempts - 1, snoozes = snoozes + 1, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(id)s AND lease_token = %(lease_token)s AND status = 'running'
    RETURNING id, attempts, worker_id
),
history AS (
    INSERT INTO outboxq_job_errors (job_id, attempt, error, kind, worker_id)
    SELECT id, attempts + 1, %(error)s, 'snooze', worker_id FROM snoozed
)
SELECT id, 'queued' AS status FROM snoozed
"""

# The handlers' return values, written just before their jobs are completed (same transaction, same fence).
job_store_results = """
UPDATE outboxq_jobs j
SET result = r.result
FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[], %(results)s::jsonb[]) AS r(id, lease_token, result)
WHERE j.id = r.id AND j.status = 'running' AND j.lease_token = r.lease_token
"""

# ctx.set_progress(), fenced by the lease.
job_set_progress = """
UPDATE outboxq_jobs SET progress = %(progress)s, progress_message = %(message)s
WHERE id = %(id)s AND lease_token = %(lease_token)s AND status = 'running'
RETURNING id
"""

# A cancel the handler honoured (it saw ctx.cancelled and stopped), fenced.
job_finish_cancelled = """
UPDATE outboxq_jobs
SET status = 'cancelled', finished_at = now(), lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(lease_token)s AND status = 'running'
RETURNING id
"""

# On shutdown: jobs claimed but never started go straight back to the queue (their attempt is undone).
job_release_unstarted = f"""
UPDATE outboxq_jobs j
{RELEASE_SET}
FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[]) AS r(id, lease_token)
WHERE j.id = r.id AND j.lease_token = r.lease_token AND j.status = 'running'
RETURNING j.id
"""

# Renew the leases of running jobs. Ids missing from the result were fenced; cancel_requested tells the
# handler to stop. A lease that has lapsed is lost even before rescue takes the job back: the limits' claims
# stop counting a job at its lease's end and may have given its slot away already (a worker frozen past its
# lease must not come back to life beside the job that took its slot).
job_heartbeat = """
UPDATE outboxq_jobs j
SET lease_expires_at = now() + %(lease_s)s::float8 * interval '1 second'
WHERE j.id = ANY(%(ids)s::bigint[])
  AND j.lease_token = ((SELECT jsonb_object(%(ids)s::bigint[]::text[], %(lease_tokens)s::uuid[]::text[]))
                       ->> j.id::text)::uuid
  AND (j.status = 'running') IS TRUE  -- by primary key, as job_complete_batch
  AND j.lease_expires_at > clock_timestamp()
RETURNING j.id, j.cancel_requested
"""

# Used by ctx.transaction(): lock the job's row if (and only if) this worker still holds its lease, and the
# lease has not lapsed (see job_heartbeat).
job_lock_if_leased = """
SELECT id FROM outboxq_jobs
WHERE id = %(id)s AND lease_token = %(lease_token)s AND status = 'running'
  AND lease_expires_at > clock_timestamp()
FOR UPDATE
"""

# Jobs of one queue after a position, below the reader's snapshot xmin, in (created_xid, id) order.
# A job's result is read only when the listing asks for it: results may be large (OUTBOXQ_MAX_RESULT_BYTES each),
# and a page holds up to 1,000 jobs.
_FEED_COLUMNS = (f"{_COLUMNS_BEFORE_RESULT}, CASE WHEN %(include_result)s THEN result END AS result, "
                 f"{_COLUMNS_AFTER_RESULT}")

# The running jobs are not in the feed index (a claim would write an entry there: migration 0012): they are read
# through the queue's range of the lease index, whose entries are the running jobs (as many as the workers hold;
# by queue since migration 0013), and merged with the others in feed order.
_FEED_PART = f"""(SELECT {_FEED_COLUMNS}, created_xid
 FROM outboxq_jobs
 WHERE queue = %(queue)s AND {{part}}
   AND created_xid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
   AND (created_xid, id) > (%(after_xid)s::bigint, %(after_id)s::bigint)
   AND (%(status)s::text IS NULL OR status = %(status)s::text)
 ORDER BY created_xid, id
 LIMIT %(limit)s)"""

job_feed_page = f"""
SELECT * FROM (
{_FEED_PART.format(part="status <> 'running'")}
UNION ALL
{_FEED_PART.format(part="status = 'running'")}
) page
ORDER BY created_xid, id
LIMIT %(limit)s
"""

job_retry_now = f"""
WITH retried AS (
    UPDATE outboxq_jobs
    {RETRY_SET}
    WHERE id = %(id)s AND status IN {RETRIABLE}
    RETURNING id, queue
)
SELECT id, pg_notify('{NOTIFY_CHANNEL}', queue) FROM retried
"""

# Re-run a finished (done) job: used by the testing helpers to check a handler's idempotence.
job_requeue_done = """
UPDATE outboxq_jobs SET status = 'queued', run_at = now(), finished_at = NULL
WHERE id = %(id)s AND status = 'done'
RETURNING id
"""

job_cancel = f"""
WITH cancelled AS (
    UPDATE outboxq_jobs
    {CANCEL_SET}
    WHERE id = %(id)s AND status IN {CANCELLABLE}
    RETURNING id, status
),
notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', '{CANCEL_NOTICE}') FROM cancelled WHERE status = 'running')
SELECT id, status, (SELECT count(*) FROM notified) AS notified FROM cancelled
"""

job_error_history = """
SELECT attempt, error, traceback, failed_at, kind, worker_id FROM outboxq_job_errors
WHERE job_id = %(id)s ORDER BY id
"""

# A sequence's turn: the enqueuer takes the sequence's row (waiting for another enqueuer of the sequence to
# commit), and reads the newest job as of that commit (an upsert works on the latest row version under READ
# COMMITTED; under REPEATABLE READ a concurrent enqueuer makes it a serialization failure, never a wrong order).
sequence_take_turn = """
INSERT INTO outboxq_sequences AS s (sequence) VALUES (%(sequence)s)
ON CONFLICT (sequence) DO UPDATE SET updated_at = now()
RETURNING s.last_job_id
"""

# The status of the sequence's newest job, in a statement of its own: its snapshot is taken after the turn.
job_status_of = "SELECT id, queue, key, status FROM outboxq_jobs WHERE id = %(id)s"

sequence_set_last = "UPDATE outboxq_sequences SET last_job_id = %(job_id)s WHERE sequence = %(sequence)s"

# The link to the sequence's job before: 'sequence' (held while it is dead) or 'run' (on_failure="continue").
job_sequence_link_insert = """
INSERT INTO outboxq_job_dependencies (job_id, depends_on_id, on_failure)
VALUES (%(job_id)s, %(depends_on_id)s, %(on_failure)s)
ON CONFLICT (job_id, depends_on_id) DO UPDATE SET on_failure = EXCLUDED.on_failure
"""

# What a job waits for, and what waits for it.
job_dependencies_of = """
SELECT 'depends_on' AS direction, j.id, j.queue, j.key, j.status
FROM outboxq_job_dependencies d JOIN outboxq_jobs j ON j.id = d.depends_on_id
WHERE d.job_id = %(id)s
UNION ALL
SELECT 'dependents', j.id, j.queue, j.key, j.status
FROM outboxq_job_dependencies d JOIN outboxq_jobs j ON j.id = d.job_id
WHERE d.depends_on_id = %(id)s
ORDER BY 1, 2
"""

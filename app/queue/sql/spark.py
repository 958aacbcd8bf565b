"""Every statement the Spark consumers (spark_jobs) run, named entity-first.

The exactly-once protocol (Cues' snapshot + delivery hash, Gazette's epoch fence) in SQL: a driver row
carries the driver's fencing epoch, a snapshot row records a claimed batch before it is processed (held by
one driver under a lease token until its lease lapses), and a delivery marks that snapshot delivered in the
same transaction that writes the results and completes the jobs. Any number of drivers of one processor
run at once; each claims its own snapshots, and adopts those whose driver stopped renewing their lease.
"""

from __future__ import annotations

from outboxq.queue.sql import jobs as job_sql

# ---------------------------------------------------------------- drivers and their fencing epoch

# A driver without an id of its own takes the first free slot of its processor: a session lock, released by
# PostgreSQL when the driver's connection ends, so a restarted driver gets its dead predecessor's slot (and
# id) back, while drivers running side by side get different ones.
spark_driver_try_slot = """
SELECT pg_try_advisory_lock(hashtext('outboxq_spark_driver:' || %(processor_id)s), %(slot)s) AS taken
"""

# A driver that stops gives its slot back at once: a closed connection's backend releases its locks only
# when it has exited, a moment later, and a driver restarted within that moment would take another slot
# (another id) and wait out the lease of its predecessor's snapshots instead of adopting them.
spark_driver_release_slot = """
SELECT pg_advisory_unlock(hashtext('outboxq_spark_driver:' || %(processor_id)s), %(slot)s) AS released
"""

# Starting a driver bumps its epoch: every claim and delivery of an older epoch of the same driver id is
# refused from now on (a restarted driver fences its predecessor; other drivers are not affected).
spark_driver_bump_epoch = """
INSERT INTO outboxq_spark_drivers (driver_id, processor_id, epoch, started_at)
VALUES (%(driver_id)s, %(processor_id)s, 1, now())
ON CONFLICT (driver_id) DO UPDATE
SET epoch = outboxq_spark_drivers.epoch + 1, processor_id = EXCLUDED.processor_id, started_at = now()
RETURNING epoch
"""

# Taken at the start of every claim and delivery transaction. FOR SHARE makes a concurrent epoch bump wait
# for this transaction, so once a restarted driver has bumped the epoch no older transaction can commit.
spark_driver_lock_epoch = """
SELECT epoch FROM outboxq_spark_drivers WHERE driver_id = %(driver_id)s FOR SHARE
"""

# ---------------------------------------------------------------- claiming a batch

# The job's payload as one JSON object with the job's id and queue (they win over payload fields of the
# same name); NULL when the payload is not a JSON object (a custom codec's bytes, an array, a scalar).
_ROW_JSON = (
    "CASE WHEN jsonb_typeof(j.payload) = 'object' "
    "THEN (j.payload || jsonb_build_object('job_id', j.id, 'queue', j.queue))::text END AS row_json"
)

# Due jobs of a queue (fresh ones first, in the worker's claim order), locked with SKIP LOCKED so that
# concurrent processors never claim the same job; a paused queue gives nothing.
_SPARK_JOBS_CLAIM = """
WITH picked AS (
    SELECT id FROM outboxq_jobs
    WHERE queue = %(queue)s AND status IN ('queued', 'retrying') AND run_at <= now(){also}
      AND NOT EXISTS (SELECT 1 FROM outboxq_queues q WHERE q.queue = %(queue)s AND q.paused)
    ORDER BY status = 'retrying', priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE outboxq_jobs j
{claim_set}
WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING j.id, j.queue, j.attempts, j.max_attempts, {row_json}
"""
spark_jobs_claim = _SPARK_JOBS_CLAIM.format(also="", claim_set=job_sql.CLAIM_SET, row_json=_ROW_JSON)
# The same among the jobs with ids up to id_to: a streaming query run with Trigger.AvailableNow reads the jobs
# there were when it started, not those enqueued while it runs.
spark_jobs_claim_up_to = _SPARK_JOBS_CLAIM.format(also=" AND id <= %(id_to)s", claim_set=job_sql.CLAIM_SET,
                                                  row_json=_ROW_JSON)

# The snapshot of a claimed batch, committed before processing. A snapshot of the same hash that failed
# before (the same jobs claimed together again after a failure) is taken over, with a new id (a streaming
# query's offsets are snapshot ids and only grow); a delivered one is not, and the statement then returns
# no row.
spark_snapshot_insert = """
INSERT INTO outboxq_spark_snapshots
    (processor_id, queue, epoch, job_ids, lease_token, delivery_hash, output_table, driver_id,
     lease_expires_at)
VALUES (%(processor_id)s, %(queue)s, 1, %(job_ids)s, %(lease_token)s, %(delivery_hash)s,
        %(output_table)s, %(driver_id)s, now() + %(lease_s)s::float8 * interval '1 second')
ON CONFLICT (delivery_hash) DO UPDATE
SET id = DEFAULT, queue = EXCLUDED.queue, epoch = 1, job_ids = EXCLUDED.job_ids,
    lease_token = EXCLUDED.lease_token, output_table = EXCLUDED.output_table, state = 'claimed',
    rows_written = NULL, error = NULL, created_at = now(), delivered_at = NULL,
    driver_id = EXCLUDED.driver_id, lease_expires_at = EXCLUDED.lease_expires_at
WHERE outboxq_spark_snapshots.state = 'failed'
RETURNING id, epoch
"""

# ---------------------------------------------------------------- adoption (recovery)

# Undelivered snapshots a driver may adopt: its own (left by its predecessor of the same id) and those of
# any driver of the processor whose lease lapsed (a snapshot from before leases existed has none). SKIP
# LOCKED: a snapshot being delivered right now, or adopted by another driver, is not waited for.
spark_snapshot_list_adoptable = """
SELECT id, processor_id, queue, epoch, job_ids, lease_token, delivery_hash, output_table
FROM outboxq_spark_snapshots
WHERE processor_id = %(processor_id)s AND state = 'claimed'
  AND (driver_id = %(driver_id)s OR coalesce(lease_expires_at, '-infinity') < now())
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# The adopting driver holds the snapshot from now on under a new lease token: the old holder's delivery,
# renewal or failure (all fenced by the token) is refused. The delivery hash and the jobs stay the same.
spark_snapshot_adopt = """
UPDATE outboxq_spark_snapshots
SET driver_id = %(driver_id)s, lease_token = %(new_lease_token)s, epoch = epoch + 1,
    lease_expires_at = now() + %(lease_s)s::float8 * interval '1 second'
WHERE id = %(id)s AND lease_token = %(lease_token)s AND state = 'claimed'
RETURNING epoch
"""

# Undelivered snapshots of the processor, whoever holds them: a driver told to stop when the queue is
# empty waits for them (it adopts them if their driver dies).
spark_snapshot_count_claimed = """
SELECT count(*) AS claimed FROM outboxq_spark_snapshots
WHERE processor_id = %(processor_id)s AND state = 'claimed'
"""

# Take the snapshot's jobs under the adopter's new lease token: those the snapshot still holds, and those a
# lease rescue put back in the queue (a new attempt). A job that finished or another consumer holds is not.
spark_jobs_relock_for_snapshot = """
UPDATE outboxq_jobs j
SET status = 'running',
    attempts = CASE WHEN j.status = 'running' THEN j.attempts ELSE j.attempts + 1 END,
    max_attempts = coalesce(j.max_attempts, %(default_max_attempts)s),
    lease_token = %(new_lease_token)s,
    lease_expires_at = now() + %(lease_s)s::float8 * interval '1 second',
    worker_id = %(worker_id)s,
    attempt_started_at = now()
WHERE j.id = ANY(%(ids)s::bigint[])
  AND ((j.status = 'running' AND j.lease_token = %(lease_token)s) OR j.status IN ('queued', 'retrying'))
RETURNING j.id
"""

spark_jobs_read_for_snapshot = f"""
SELECT j.id, j.queue, j.attempts, j.max_attempts, {_ROW_JSON}
FROM outboxq_jobs j
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.lease_token = %(lease_token)s AND j.status = 'running'
ORDER BY j.id
"""

# The jobs of a snapshot that cannot be delivered any more go back to the queue; their attempt is undone.
spark_jobs_release = f"""
UPDATE outboxq_jobs j
{job_sql.RELEASE_SET}
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.lease_token = %(lease_token)s AND j.status = 'running'
RETURNING j.id
"""

# ---------------------------------------------------------------- leases while processing

spark_jobs_extend_lease = """
UPDATE outboxq_jobs
SET lease_expires_at = now() + %(lease_s)s::float8 * interval '1 second'
WHERE id = ANY(%(ids)s::bigint[]) AND lease_token = %(lease_token)s AND status = 'running'
"""

# No row: the snapshot was adopted by another driver (or delivered); this driver no longer holds it.
spark_snapshot_extend_lease = """
UPDATE outboxq_spark_snapshots
SET lease_expires_at = now() + %(lease_s)s::float8 * interval '1 second'
WHERE id = %(id)s AND lease_token = %(lease_token)s AND state = 'claimed'
RETURNING id
"""

# ---------------------------------------------------------------- delivery

# Fenced by the snapshot's lease token and state: a snapshot is delivered (or failed) once. The lock is
# taken first, so a concurrent delivery of the same snapshot waits and then finds it delivered.
spark_snapshot_lock_claimed = """
SELECT id FROM outboxq_spark_snapshots
WHERE id = %(id)s AND lease_token = %(lease_token)s AND state = 'claimed'
FOR UPDATE
"""

spark_snapshot_mark_delivered = """
UPDATE outboxq_spark_snapshots
SET state = 'delivered', delivered_at = now(), rows_written = %(rows_written)s, error = %(error)s,
    lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(lease_token)s AND state = 'claimed'
RETURNING id
"""

spark_snapshot_mark_failed = """
UPDATE outboxq_spark_snapshots
SET state = 'failed', error = %(error)s, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(lease_token)s AND state = 'claimed'
RETURNING id
"""

# A handled error, Cues-style: the bad job's payload and error go to the error queue (in the delivery's
# transaction), and the job itself is dead at once: a malformed payload does not fix itself by retrying.
spark_error_queue_insert = f"""
INSERT INTO outboxq_jobs (queue, status, payload)
SELECT %(error_queue)s, 'queued',
       jsonb_build_object('job_id', j.id, 'queue', j.queue, 'payload', j.payload, 'error', f.error,
                          'delivery_hash', %(delivery_hash)s::text)
FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS f(id, error)
JOIN outboxq_jobs j ON j.id = f.id AND j.lease_token = %(lease_token)s AND j.status = 'running'
RETURNING id, {job_sql.NOTIFY_IF_READY} AS notified
"""

# ---------------------------------------------------------------- output tables (in the results schema)

# One creator at a time per results schema (two drivers may deliver their first batch at once).
spark_output_table_lock = "SELECT pg_advisory_xact_lock(hashtext('outboxq_spark_output:' || %(schema)s))"

spark_output_table_columns = """
SELECT a.attname AS name
FROM pg_attribute a
WHERE a.attrelid = to_regclass(quote_ident(%(schema)s) || '.' || quote_ident(%(table)s))
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

# Templates for psycopg.sql: every name is filled in as an Identifier, every type from postgres_type().
# CREATE SCHEMA IF NOT EXISTS checks the CREATE privilege on the database before it looks whether the schema
# exists: a least-privilege role (USAGE, CREATE on the results schema only) must not run it when it does.
spark_results_schema_exists = "SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s"
spark_results_schema_create = "CREATE SCHEMA IF NOT EXISTS {schema}"
spark_output_column = "{name} {type}"
spark_output_hash_column = "{name} text NOT NULL"
spark_output_table_create = "CREATE TABLE {table} ({columns})"
spark_output_table_index = "CREATE INDEX {index} ON {table} ({column})"
spark_output_table_copy = "COPY {table} ({columns}) FROM STDIN"
# Results kept in Arrow columns arrive as CSV blocks written by Arrow (spark_jobs.columnar).
spark_output_table_copy_csv = "COPY {table} ({columns}) FROM STDIN (FORMAT csv)"

# ---------------------------------------------------------------- batches (POST /v1/spark/batches)

spark_batch_insert = """
INSERT INTO outboxq_spark_batches (queue, processor, output_table, batch_size, master)
VALUES (%(queue)s, %(processor)s, %(output_table)s, %(batch_size)s, %(master)s)
RETURNING id
"""

# HTTP submissions one at a time (a transaction lock): each counts the batches at work, then adds its own.
spark_batch_submit_lock = "SELECT pg_advisory_xact_lock(hashtext('outboxq_spark_batch_submit'))"

# The batches at work: running, as the batch slots held (spark_batch_try_slot: a running batch's process holds
# one while it lives, so a batch whose process died is not counted, whatever its row says), and pending.
spark_batch_count_active = """
SELECT (SELECT count(*) FROM pg_locks
        WHERE locktype = 'advisory' AND granted AND objsubid = 2
          AND classid = hashtext('outboxq_spark_batch_slot')::oid
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) AS running,
       (SELECT count(*) FROM outboxq_spark_batches WHERE state = 'pending') AS pending
"""

spark_batch_get = """
SELECT id, queue, processor, output_table, batch_size, master, state, jobs_claimed, rows_written, error,
       created_at, started_at, finished_at
FROM outboxq_spark_batches WHERE id = %(id)s
"""

# One of OUTBOXQ_SPARK_MAX_BATCHES slots, held by a running batch's process as a session lock (freed by
# PostgreSQL when that process dies).
spark_batch_try_slot = """
SELECT pg_try_advisory_lock(hashtext('outboxq_spark_batch_slot'), %(slot)s) AS taken
"""

spark_batch_mark_running = """
UPDATE outboxq_spark_batches SET state = 'running', started_at = now()
WHERE id = %(id)s AND state = 'pending'
RETURNING id, queue, processor, output_table, batch_size, master
"""

spark_batch_add_progress = """
UPDATE outboxq_spark_batches
SET jobs_claimed = jobs_claimed + %(jobs_claimed)s, rows_written = rows_written + %(rows_written)s,
    error = coalesce(%(error)s, error)
WHERE id = %(id)s
"""

spark_batch_finish = """
UPDATE outboxq_spark_batches
SET state = %(state)s, error = coalesce(%(error)s, error), finished_at = now()
WHERE id = %(id)s AND state IN ('pending', 'running')
"""

# The snapshots a batch's processor took while the batch ran (until now if it still runs).
spark_snapshot_list_for_batch = """
SELECT id, state, jsonb_array_length(job_ids) AS jobs, rows_written, delivery_hash, error, created_at,
       delivered_at, driver_id, epoch
FROM outboxq_spark_snapshots
WHERE processor_id = %(processor_id)s AND created_at >= %(since)s
  AND created_at <= coalesce(%(until)s::timestamptz, now())
ORDER BY id
LIMIT 1000
"""

# The API's listing reads straight from the table: it works where the spark extra is not installed.
spark_batch_list = """
SELECT id, queue, processor, output_table, batch_size, master, state, jobs_claimed, rows_written, error,
       created_at, started_at, finished_at
FROM outboxq_spark_batches ORDER BY id DESC LIMIT %(limit)s
"""

# ---------------------------------------------------------------- `python -m tools spark-bench` (tools/spark_bench.py)

spark_bench_drop_output = "DROP TABLE IF EXISTS {table}"

spark_bench_delete_jobs = "DELETE FROM outboxq_jobs WHERE queue = %(queue)s"

# Every round starts from a vacuumed jobs table, whatever autovacuum does meanwhile: otherwise the dead rows
# of the earlier rounds slow each later claim, and the engine that runs second in a round pays for them.
# ANALYZE too: on a server without autovacuum a table never analyzed gave the claim's UPDATE a plan that read
# outboxq_jobs_feed_idx once per claimed id (id is its last column), and a large round took minutes.
spark_bench_vacuum_jobs = "VACUUM ANALYZE outboxq_jobs"

# What the benchmark's database has done so far (its per-micro-batch cost is the difference over a run).
spark_bench_database_counters = """
SELECT xact_commit AS transactions, tup_inserted AS rows_inserted, tup_updated AS rows_updated,
       tup_fetched AS rows_fetched, blks_hit + blks_read AS blocks_touched
FROM pg_stat_database WHERE datname = current_database()
"""

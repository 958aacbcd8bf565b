"""Every statement of the "outboxq" Spark data source (spark_jobs.datasource): batch reads, the streaming
source's micro-batches and the sink's exactly-once writes.

A streaming query's micro-batch is one or more snapshots of processor ``stream:<name>`` (claimed with the
Spark consumers' statements in sql.spark); its offset is the id of the newest of them. The sink writes a
job's rows and completes the job in one transaction, fenced by the lease its snapshot holds now, so a
micro-batch written twice finds its jobs done and writes nothing twice.
"""

from __future__ import annotations

# The columns a read gives, in the order of datasource.JOB_COLUMNS.
_JOB_COLUMNS = (
    "j.id, j.queue, j.key, j.status, j.payload::text, j.attempts, j.created_at, j.finished_at, "
    "j.result::text, j.last_error"
)

# Filters pushed down by Spark (each NULL when not pushed): statuses, and inclusive bounds on the id and on
# the creation and finishing times (a strict bound is pushed inclusive and checked again by Spark).
_PUSHED = """
  AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
  AND (%(created_from)s::timestamptz IS NULL OR j.created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR j.created_at <= %(created_to)s::timestamptz)
  AND (%(finished_from)s::timestamptz IS NULL OR j.finished_at >= %(finished_from)s::timestamptz)
  AND (%(finished_to)s::timestamptz IS NULL OR j.finished_at <= %(finished_to)s::timestamptz)
"""

# ---------------------------------------------------------------- batch read (claims nothing)

# The least and greatest id of a queue's jobs, in two parts: the running jobs are not in the feed index (migration
# 0012), whose range of the queue is what keeps these reads short for a small queue in a large table (the primary
# key alone would walk every other queue's newer jobs).
_ID_BOUNDS = """SELECT min(j.id) AS low, max(j.id) AS high FROM outboxq_jobs j
    WHERE j.queue = %(queue)s AND {part} AND j.id BETWEEN {id_from} AND {id_to}{pushed}"""


def _id_bounds(id_from: str, id_to: str, pushed: str = "") -> str:
    """The least (low) and greatest (high) id of the queue's jobs within [id_from, id_to]; NULLs where none."""
    parts = (_ID_BOUNDS.format(part=part, id_from=id_from, id_to=id_to, pushed=pushed)
             for part in ("j.status <> 'running'", "j.status = 'running'"))
    return ("SELECT min(low) AS low, max(high) AS high FROM (\n    " + "\n    UNION ALL\n    ".join(parts)
            + "\n) parts")


# The id range a batch read splits into partitions.
spark_source_id_range = _id_bounds("%(id_from)s", "%(id_to)s", _PUSHED.rstrip())

# One partition of a batch read: the queue's jobs with ids in [low, high].
spark_source_read_range = f"""
SELECT {_JOB_COLUMNS}, NULL::text AS delivery_hash FROM outboxq_jobs j
WHERE j.queue = %(queue)s AND j.id BETWEEN %(low)s AND %(high)s
{_PUSHED}
ORDER BY j.id
"""

# ---------------------------------------------------------------- streaming source

# Where a new query (no checkpoint yet) starts: before the oldest snapshot this stream still holds, else after
# its newest one (a stream that ran before under this name does not read its old micro-batches again).
spark_stream_initial_offset = """
SELECT coalesce(min(id) FILTER (WHERE state = 'claimed') - 1, max(id), 0) AS id
FROM outboxq_spark_snapshots WHERE processor_id = %(processor_id)s
"""

# The newest job of the queue: what a query run with Trigger.AvailableNow reads up to.
spark_stream_newest_job = f"SELECT coalesce(high, 0) AS id FROM ({_id_bounds('0', '9223372036854775807')}) bounds"

# A queue's jobs ready to be read (the stream's lag), for the queue `queue_expression` names.
def _ready_count(queue_expression: str) -> str:
    return ("SELECT count(*) AS ready FROM outboxq_jobs j "
            f"WHERE j.queue = {queue_expression} AND j.status IN ('queued', 'retrying') AND j.run_at <= now()")


spark_stream_ready_count = _ready_count("%(queue)s")

# A snapshot of the stream newer than the micro-batch's start that no micro-batch has read yet: claimed by a
# query that stopped before Spark recorded the offset. The next micro-batch takes it instead of a new claim.
spark_stream_unread_snapshot = """
SELECT max(id) AS id FROM outboxq_spark_snapshots
WHERE processor_id = %(processor_id)s AND state = 'claimed' AND id > %(start)s
"""

# The snapshots of a micro-batch (its start and end offsets), whatever became of them since: a replayed
# micro-batch reads the very jobs it read the first time.
spark_stream_snapshots_between = """
SELECT id, job_ids, delivery_hash FROM outboxq_spark_snapshots
WHERE processor_id = %(processor_id)s AND id > %(start)s AND id <= %(end)s
ORDER BY id
"""

# One partition of a micro-batch: the given jobs of one snapshot, whatever their status now.
spark_stream_read_jobs = f"""
SELECT {_JOB_COLUMNS}, %(delivery_hash)s::text AS delivery_hash FROM outboxq_jobs j
WHERE j.id = ANY(%(ids)s::bigint[])
ORDER BY j.id
"""

# Spark has finished the micro-batches up to `end`: their snapshots still claimed are settled (their jobs
# that no written row completed, the rows a query filtered out, are done now).
spark_stream_settle_snapshots = """
SELECT id, job_ids, lease_token, delivery_hash FROM outboxq_spark_snapshots
WHERE processor_id = %(processor_id)s AND state = 'claimed' AND id <= %(end)s
ORDER BY id
FOR UPDATE
"""

# The stream's snapshots still claimed, for the query's lease renewal.
spark_stream_claimed_snapshots = """
SELECT id, job_ids, lease_token FROM outboxq_spark_snapshots
WHERE processor_id = %(processor_id)s AND state = 'claimed'
ORDER BY id
"""

# ---------------------------------------------------------------- the stream's row (operators, metrics)

spark_stream_register = """
INSERT INTO outboxq_spark_streams (name, queue, application_id, host, pid, epoch)
VALUES (%(name)s, %(queue)s, %(application_id)s, %(host)s, %(pid)s, %(epoch)s)
ON CONFLICT (name) DO UPDATE
SET queue = EXCLUDED.queue, application_id = EXCLUDED.application_id, host = EXCLUDED.host,
    pid = EXCLUDED.pid, epoch = EXCLUDED.epoch, started_at = now(), last_seen_at = now(), stopped_at = NULL
"""

spark_stream_add_progress = """
UPDATE outboxq_spark_streams
SET micro_batches = micro_batches + %(micro_batches)s, jobs_read = jobs_read + %(jobs)s,
    lease_renewals = lease_renewals + %(renewals)s, last_seen_at = now()
WHERE name = %(name)s AND epoch = %(epoch)s
"""

spark_stream_stop = """
UPDATE outboxq_spark_streams SET stopped_at = now(), last_seen_at = now()
WHERE name = %(name)s AND epoch = %(epoch)s
"""

# A stream whose reader has not said a word for this long is no longer running (its reader says it every
# datasource.HEARTBEAT_S).
STREAM_LAPSE_S = 60.0

# Streams seen within the lapse (running) and the newest stopped ones, with how many jobs their queue has ready
# (the lag).
spark_stream_list = f"""
SELECT s.name, s.queue, s.application_id, s.host, s.pid, s.epoch, s.micro_batches, s.jobs_read,
       s.lease_renewals, s.started_at, s.last_seen_at, s.stopped_at,
       s.stopped_at IS NULL AND s.last_seen_at > now() - %(lapse_s)s::float8 * interval '1 second' AS running,
       ({_ready_count("s.queue")}) AS lag
FROM outboxq_spark_streams s
ORDER BY running DESC, s.last_seen_at DESC
LIMIT %(limit)s
"""

# ---------------------------------------------------------------- sink

# The jobs of the rows a sink partition writes that their micro-batch's snapshot still holds: locked, so the
# rows and the completion commit together; a job done already (the micro-batch written before) is not here.
spark_sink_lock_held = """
SELECT j.id, j.attempts, j.max_attempts, j.lease_token
FROM outboxq_jobs j JOIN outboxq_spark_snapshots s ON s.lease_token = j.lease_token
WHERE j.id = ANY(%(ids)s::bigint[]) AND s.delivery_hash = ANY(%(hashes)s::text[])
  AND s.state = 'claimed' AND j.status = 'running'
ORDER BY j.id
FOR UPDATE OF j FOR SHARE OF s
"""

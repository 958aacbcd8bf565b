"""Read-only figures: the stats routes and GET /metrics (unfinished work only; tests check the plans)."""

from __future__ import annotations

# Retry statistics over jobs finished in the window: how many succeeded at the first attempt, how many
# needed retries.
stats_retries = """
SELECT queue,
       count(*) FILTER (WHERE status = 'done') AS ok,
       coalesce(sum(attempts - 1) FILTER (WHERE attempts > 1), 0) AS retries,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       count(*) AS finished
FROM outboxq_jobs
WHERE status IN ('done', 'dead') AND finished_at >= %(since)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
GROUP BY queue ORDER BY queue
"""

stats_processing_time = """
SELECT queue, count(*) AS jobs,
       avg(ms) AS avg_ms, min(ms) AS min_ms, max(ms) AS max_ms,
       percentile_cont(0.50) WITHIN GROUP (ORDER BY ms) AS p50_ms,
       percentile_cont(0.90) WITHIN GROUP (ORDER BY ms) AS p90_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY ms) AS p95_ms,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99_ms
FROM (SELECT queue, extract(epoch FROM finished_at - attempt_started_at) * 1000 AS ms
      FROM outboxq_jobs
      WHERE status = 'done' AND finished_at >= %(since)s AND attempt_started_at IS NOT NULL
        AND (%(queue)s::text IS NULL OR queue = %(queue)s)) t
GROUP BY queue ORDER BY queue
"""

# Per-minute finished and failed attempts over the last `minutes` (the dashboard's chart).
stats_throughput = """
WITH buckets AS (
    SELECT generate_series(date_trunc('minute', %(now)s::timestamptz) - (%(minutes)s - 1) * interval '1 minute',
                           date_trunc('minute', %(now)s::timestamptz), interval '1 minute') AS minute
),
done AS (
    SELECT date_trunc('minute', finished_at) AS minute, count(*) AS n FROM outboxq_jobs
    WHERE status = 'done' AND finished_at > %(now)s::timestamptz - %(minutes)s * interval '1 minute'
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    GROUP BY 1
),
failed AS (
    SELECT date_trunc('minute', e.failed_at) AS minute, count(*) AS n
    FROM outboxq_job_errors e JOIN outboxq_jobs j ON j.id = e.job_id
    WHERE e.failed_at > %(now)s::timestamptz - %(minutes)s * interval '1 minute' AND e.kind = 'error'
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
    GROUP BY 1
)
SELECT b.minute, coalesce(d.n, 0) AS done, coalesce(f.n, 0) AS failed
FROM buckets b LEFT JOIN done d ON d.minute = b.minute LEFT JOIN failed f ON f.minute = b.minute
ORDER BY b.minute
"""

#
# One branch per unfinished status, each matching a partial index's predicate, so the cost follows the
# unfinished jobs and never the finished history (tests/queue/test_query_plans.py checks the plans).
def _unfinished_counts(queue_filter: str) -> str:
    return "\nUNION ALL\n".join(
        f"SELECT queue, '{status}' AS status, count(*) AS n FROM outboxq_jobs WHERE status = '{status}'"
        f"{queue_filter} GROUP BY queue" for status in ("queued", "retrying", "running", "waiting"))


metrics_unfinished_counts = _unfinished_counts("")


def _queue_counts(queue_filter: str) -> str:
    return f"""
WITH counted AS (
    {_unfinished_counts(queue_filter)}
    UNION ALL
    SELECT queue, status, count(*) FROM outboxq_jobs
    WHERE status IN ('done', 'dead', 'cancelled')
      AND finished_at >= now() - %(finished_window_s)s::float8 * interval '1 second'{queue_filter}
    GROUP BY queue, status
),
names AS (SELECT queue FROM counted UNION SELECT queue FROM outboxq_queues q WHERE true{queue_filter})
SELECT n.queue,
       coalesce(q.paused, false) AS paused,
       q.failing_since,
       coalesce((SELECT jsonb_object_agg(c.status, c.n) FROM counted c WHERE c.queue = n.queue), '{{}}'::jsonb)
           AS counts
FROM names n
LEFT JOIN outboxq_queues q ON q.queue = n.queue
ORDER BY n.queue
"""


# Every queue (with unfinished jobs, jobs finished within the window, or a row in outboxq_queues) and its
# counts per status: unfinished ones from the metrics' partial-index branches, finished ones within the last
# %(finished_window_s)s seconds through the finished_at index. The cost follows the unfinished jobs and the
# window, never the whole finished history (GET /v1/queues, `outboxq queues`).
queue_counts = _queue_counts("")
# The same for one queue (GET /v1/queues/{queue}, a queue's page): its own jobs only.
queue_counts_one = _queue_counts(" AND queue = %(queue)s")

# Queue lag: how long the oldest job that could run now has been ready (0 when none is).
def _queue_lag(queue_filter: str) -> str:
    return f"""
SELECT queue, extract(epoch FROM now() - min(run_at))::float8 AS lag_s
FROM outboxq_jobs WHERE status = 'queued' AND run_at <= now(){queue_filter}
GROUP BY queue
"""


metrics_queue_lag = _queue_lag("")
queue_lag_one = _queue_lag(" AND queue = %(queue)s")

metrics_queue_states = "SELECT queue, paused, failing_since IS NOT NULL AS failing FROM outboxq_queues"

# How many limit keys have jobs running now, per per-key queue: GET /metrics shows this count rather than the
# keys (they come from payloads: customer ids, say) unless OUTBOXQ_METRICS_KEY_LABELS is set. The running jobs
# are read as queue_limits_usage reads them (the lease index), never the finished history.
metrics_limit_keys_running = """
SELECT l.queue, k.keys
FROM outboxq_queue_limits l
CROSS JOIN LATERAL (
    SELECT count(DISTINCT limit_key) AS keys FROM outboxq_jobs
    WHERE status = 'running' AND queue = l.queue AND lease_expires_at > clock_timestamp()
) k
WHERE l.per_key
ORDER BY l.queue
"""

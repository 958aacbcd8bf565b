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
metrics_unfinished_counts = """
SELECT queue, 'queued' AS status, count(*) AS n FROM outboxq_jobs WHERE status = 'queued' GROUP BY queue
UNION ALL
SELECT queue, 'retrying', count(*) FROM outboxq_jobs WHERE status = 'retrying' GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*) FROM outboxq_jobs WHERE status = 'running' GROUP BY queue
UNION ALL
SELECT queue, 'waiting', count(*) FROM outboxq_jobs WHERE status = 'waiting' GROUP BY queue
"""

# Every queue (with unfinished jobs, jobs finished within the window, or a row in outboxq_queues) and its
# counts per status: unfinished ones from the metrics' partial-index branches, finished ones within the last
# %(finished_window_s)s seconds through the finished_at index. The cost follows the unfinished jobs and the
# window, never the whole finished history (GET /v1/queues, `outboxq queues`).
queue_counts = f"""
WITH counted AS (
    {metrics_unfinished_counts.strip()}
    UNION ALL
    SELECT queue, status, count(*) FROM outboxq_jobs
    WHERE status IN ('done', 'dead', 'cancelled')
      AND finished_at >= now() - %(finished_window_s)s::float8 * interval '1 second'
    GROUP BY queue, status
),
names AS (SELECT queue FROM counted UNION SELECT queue FROM outboxq_queues)
SELECT n.queue,
       coalesce(q.paused, false) AS paused,
       q.failing_since,
       coalesce((SELECT jsonb_object_agg(c.status, c.n) FROM counted c WHERE c.queue = n.queue), '{{}}'::jsonb)
           AS counts
FROM names n
LEFT JOIN outboxq_queues q ON q.queue = n.queue
ORDER BY n.queue
"""

# Queue lag: how long the oldest job that could run now has been ready (0 when none is).
metrics_queue_lag = """
SELECT queue, extract(epoch FROM now() - min(run_at))::float8 AS lag_s
FROM outboxq_jobs WHERE status = 'queued' AND run_at <= now()
GROUP BY queue
"""

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

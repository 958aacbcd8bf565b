"""What the maintenance leader runs: rescue of expired leases, promotion of waiting jobs, prune of history."""

from __future__ import annotations

from outboxq.queue.schema import NOTIFY_CHANNEL

# Jobs whose lease expired (their worker died, froze, or lost the database): retry with backoff, or dead.
# Rescue, in one transaction: lock a bounded set of jobs whose lease expired, then apply what each job's
# retry policy decided in Python (the same RetryPolicy that failed attempts use; workers/maintenance/rescue.py).
job_rescue_lock_expired = """
SELECT id, queue, attempts, max_attempts, cancel_requested, worker_id FROM outboxq_jobs
WHERE status = 'running' AND lease_expires_at < %(now)s
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

job_rescue_apply = """
WITH decided AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(statuses)s::text[], %(delays)s::float8[], %(errors)s::text[])
           AS d(id, status, delay, error)
),
rescued AS (
    UPDATE outboxq_jobs j
    SET status = d.status,
        run_at = CASE WHEN d.status = 'retrying' THEN %(now)s + d.delay * interval '1 second' ELSE j.run_at END,
        finished_at = CASE WHEN d.status IN ('dead', 'cancelled') THEN %(now)s END,
        last_error = d.error, last_traceback = NULL,
        lease_token = NULL, lease_expires_at = NULL
    FROM decided d WHERE j.id = d.id AND j.status = 'running'
    RETURNING j.id, j.queue, j.status, j.attempts, j.last_error
),
history AS (
    INSERT INTO outboxq_job_errors (job_id, attempt, error, failed_at)
    SELECT id, attempts, last_error, %(now)s FROM rescued
)
SELECT id, queue, status, attempts FROM rescued
"""

# Waiting jobs released to the queue once none of their dependencies is in `blocking` statuses, their queues
# notified. Counts what was released and how many queues were woken.
_RELEASE_WAITING = f"""
WITH released AS (
    UPDATE outboxq_jobs w
    SET status = 'queued', waiting_reason = NULL
    WHERE w.status = 'waiting'{{only}}
      AND NOT EXISTS (
          SELECT 1 FROM outboxq_job_dependencies d
          JOIN outboxq_jobs dep ON dep.id = d.depends_on_id
          WHERE d.job_id = w.id AND {{blocking}})
    RETURNING w.id, w.queue
),
notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', queue) FROM (SELECT DISTINCT queue FROM released) q)
SELECT (SELECT count(*) FROM released) AS released, (SELECT count(*) FROM notified) AS queues
"""

# Safety net for the release done at completion: a waiting job whose dependencies are all done (or were
# pruned, which only happens to finished jobs) becomes queued.
job_release_ready_waiting = _RELEASE_WAITING.format(only="", blocking="dep.status <> 'done'")

# on_dependency_failure="cancel": a waiting job with a dead or cancelled dependency is cancelled, the reason
# naming it. Its own waiting dependents see it cancelled on the next pass (maintenance repeats this until it
# cancels nothing), so a chain is cancelled link by link.
job_cancel_on_failed_dependency = """
WITH failed AS (
    SELECT w.id,
           string_agg(format('dependency %%s (queue %%s, key %%s) is %%s', dep.id, dep.queue,
                             coalesce(dep.key, '-'), dep.status), '; ' ORDER BY dep.id) AS reason
    FROM outboxq_jobs w
    JOIN outboxq_job_dependencies d ON d.job_id = w.id
    JOIN outboxq_jobs dep ON dep.id = d.depends_on_id
    WHERE w.status = 'waiting' AND w.on_dependency_failure = 'cancel' AND dep.status IN ('dead', 'cancelled')
    GROUP BY w.id
)
UPDATE outboxq_jobs w
SET status = 'cancelled', finished_at = now(), waiting_reason = failed.reason,
    last_error = 'cancelled: ' || failed.reason
FROM failed
WHERE w.id = failed.id AND w.status = 'waiting'
RETURNING w.id
"""

# on_dependency_failure="run": a waiting job runs once every dependency has finished, done or not.
job_release_on_failed_dependency = _RELEASE_WAITING.format(
    only=" AND w.on_dependency_failure = 'run'", blocking="dep.status NOT IN ('done', 'dead', 'cancelled')")

# A waiting job says why it cannot run when a dependency is dead or cancelled; the reason is cleared when
# that dependency is retried.
job_update_waiting_reasons = """
WITH reasons AS (
    SELECT w.id,
           string_agg(format('dependency %%s (queue %%s, key %%s) is %%s', dep.id, dep.queue,
                             coalesce(dep.key, '-'), dep.status), '; ' ORDER BY dep.id)
               FILTER (WHERE dep.status IN ('dead', 'cancelled')) AS reason
    FROM outboxq_jobs w
    JOIN outboxq_job_dependencies d ON d.job_id = w.id
    JOIN outboxq_jobs dep ON dep.id = d.depends_on_id
    WHERE w.status = 'waiting'
    GROUP BY w.id
)
UPDATE outboxq_jobs w SET waiting_reason = reasons.reason
FROM reasons
WHERE w.id = reasons.id AND w.waiting_reason IS DISTINCT FROM reasons.reason
RETURNING w.id, w.waiting_reason
"""

# Retention: finished jobs go in bulk, oldest first, a bounded number per statement. A dead or cancelled
# job that a waiting job depends on is kept: deleting it would look like "dependency satisfied" and
# release the waiting job (it goes once its dependents are cancelled, or it is retried and done).
job_prune_finished = """
DELETE FROM outboxq_jobs
WHERE id IN (
    SELECT f.id FROM outboxq_jobs f
    WHERE ((f.status IN ('done', 'cancelled') AND f.finished_at < %(done_before)s)
           OR (f.status = 'dead' AND f.finished_at < %(dead_before)s))
      AND (f.status = 'done' OR NOT EXISTS (
              SELECT 1 FROM outboxq_job_dependencies d JOIN outboxq_jobs w ON w.id = d.job_id
              WHERE d.depends_on_id = f.id AND w.status = 'waiting'))
    LIMIT %(limit)s
)
"""

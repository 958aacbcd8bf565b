"""What the maintenance leader runs: rescue of expired leases, promotion of waiting jobs, prune of history."""

from __future__ import annotations

from outboxq.queue.names import NOTIFY_CHANNEL

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
    RETURNING j.id, j.queue, j.status, j.attempts, j.last_error, j.worker_id
),
history AS (
    INSERT INTO outboxq_job_errors (job_id, attempt, error, failed_at, worker_id)
    SELECT id, attempts, last_error, %(now)s, worker_id FROM rescued
)
SELECT id, queue, status, attempts FROM rescued
"""

# What a waiting job does about one dependency that ended dead or cancelled: the link's own policy (a workflow's
# edge, a sequence's link) or else the job's on_dependency_failure. A link is satisfied when its dependency is
# done, or finished at all under 'run', or cancelled under 'sequence' (a dead job holds its sequence).
EDGE_POLICY = "coalesce(d.on_failure, w.on_dependency_failure)"
# (A done job still settling, its token kept, counts once its lease would have expired: sql.jobs.
# job_complete_in_lease.)
LINK_SATISFIED = ("(dep.status = 'done' AND (dep.lease_token IS NULL OR dep.lease_expires_at < now()) "
                  f"OR (dep.status IN ('dead', 'cancelled') AND {EDGE_POLICY} = 'run') "
                  f"OR (dep.status = 'cancelled' AND {EDGE_POLICY} = 'sequence'))")

# Safety net for the release done at completion, and the release of links that completion does not see: a
# waiting job whose every link is satisfied (a pruned dependency counts as done: only finished jobs are pruned)
# becomes queued, its queue notified.
job_release_ready_waiting = f"""
WITH released AS (
    UPDATE outboxq_jobs w
    SET status = 'queued', waiting_reason = NULL
    WHERE w.status = 'waiting'
      AND NOT EXISTS (
          SELECT 1 FROM outboxq_job_dependencies d
          JOIN outboxq_jobs dep ON dep.id = d.depends_on_id
          WHERE d.job_id = w.id AND NOT {LINK_SATISFIED})
    RETURNING w.id, w.queue
),
notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', queue) FROM (SELECT DISTINCT queue FROM released) q)
SELECT (SELECT count(*) FROM released) AS released, (SELECT count(*) FROM notified) AS queues
"""

# A waiting job with a dead or cancelled dependency on a 'cancel' link is cancelled, the reason naming it. Its
# own waiting dependents see it cancelled on the next pass (maintenance repeats this until it cancels nothing),
# so a chain is cancelled link by link. (cancel_requested stays false: an operator's cancel sets it, which is
# how retry_workflow tells the steps it put back from those an operator cancelled.)
job_cancel_on_failed_dependency = f"""
WITH failed AS (
    SELECT w.id,
           string_agg(format('dependency %%s (queue %%s, key %%s) is %%s', dep.id, dep.queue,
                             coalesce(dep.key, '-'), dep.status), '; ' ORDER BY dep.id) AS reason
    FROM outboxq_jobs w
    JOIN outboxq_job_dependencies d ON d.job_id = w.id
    JOIN outboxq_jobs dep ON dep.id = d.depends_on_id
    WHERE w.status = 'waiting' AND {EDGE_POLICY} = 'cancel' AND dep.status IN ('dead', 'cancelled')
    GROUP BY w.id
)
UPDATE outboxq_jobs w
SET status = 'cancelled', finished_at = now(), waiting_reason = failed.reason,
    last_error = 'cancelled: ' || failed.reason
FROM failed
WHERE w.id = failed.id AND w.status = 'waiting'
RETURNING w.id
"""

# A waiting job says why it cannot run when a dependency is dead or cancelled; the reason is cleared when
# that dependency is retried.
job_update_waiting_reasons = f"""
WITH reasons AS (
    SELECT w.id,
           string_agg(format('dependency %%s (queue %%s, key %%s) is %%s', dep.id, dep.queue,
                             coalesce(dep.key, '-'), dep.status), '; ' ORDER BY dep.id)
               FILTER (WHERE dep.status IN ('dead', 'cancelled') AND NOT {LINK_SATISFIED}) AS reason
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
# release the waiting job (it goes once its dependents are cancelled, or it is retried and done). So is a done
# workflow step that a waiting step depends on: its result is handed to that step (ctx.parent_results).
job_prune_finished = """
DELETE FROM outboxq_jobs
WHERE id IN (
    SELECT f.id FROM outboxq_jobs f
    WHERE ((f.status IN ('done', 'cancelled') AND f.finished_at < %(done_before)s)
           OR (f.status = 'dead' AND f.finished_at < %(dead_before)s))
      AND ((f.status = 'done' AND f.workflow_id IS NULL) OR NOT EXISTS (
              SELECT 1 FROM outboxq_job_dependencies d JOIN outboxq_jobs w ON w.id = d.job_id
              WHERE d.depends_on_id = f.id AND w.status = 'waiting'))
    LIMIT %(limit)s
)
"""

# A sequence's row goes once its newest job has been pruned (the next enqueue starts it afresh).
sequence_prune_finished = """
DELETE FROM outboxq_sequences s
WHERE s.updated_at < %(done_before)s
  AND NOT EXISTS (SELECT 1 FROM outboxq_jobs j WHERE j.id = s.last_job_id)
"""

# A workflow goes once its steps have all been pruned (and it is older than the finished jobs' retention).
workflow_prune_empty = """
DELETE FROM outboxq_workflows
WHERE id IN (
    SELECT wf.id FROM outboxq_workflows wf
    WHERE wf.created_at < %(done_before)s
      AND NOT EXISTS (SELECT 1 FROM outboxq_jobs j WHERE j.workflow_id = wf.id)
    ORDER BY wf.created_at
    LIMIT %(limit)s
)
"""

"""Statements on outboxq_workflows and its steps (jobs with a workflow_id): write a whole workflow, read it,
list recent ones, cancel and retry it, and what a step's handler learns of its place (ctx.parent_results)."""

from __future__ import annotations

from outboxq.queue.names import CANCEL_NOTICE, NOTIFY_CHANNEL
from outboxq.queue.sql.jobs import CANCEL_SET, RETRY_SET

# A whole workflow in ONE statement, so that it is all-or-nothing even on an autocommit connection: the
# workflow's row, every step (in the order given: those with nothing before them queued, the others waiting),
# every edge (named by step, joined to the ids just written), and one wake-up per queue with a ready step.
workflow_insert = f"""
WITH wf AS (
    INSERT INTO outboxq_workflows (name, steps) VALUES (%(name)s, cardinality(%(steps)s::text[]))
    RETURNING id
),
steps AS (
    INSERT INTO outboxq_jobs (queue, status, payload, payload_bytes, priority, max_attempts, context, limit_key,
                              on_dependency_failure, workflow_id, step)
    SELECT s.queue, s.status, s.payload, s.payload_bytes, s.priority, s.max_attempts, %(context)s, s.limit_key,
           'cancel', (SELECT id FROM wf), s.step
    FROM unnest(%(queues)s::text[], %(steps)s::text[], %(statuses)s::text[], %(payloads)s::jsonb[],
                %(payloads_bytes)s::bytea[], %(priorities)s::int[], %(max_attempts)s::int[], %(limit_keys)s::text[])
         WITH ORDINALITY AS s(queue, step, status, payload, payload_bytes, priority, max_attempts, limit_key, ord)
    ORDER BY s.ord
    RETURNING id, step, queue, status
),
edges AS (
    INSERT INTO outboxq_job_dependencies (job_id, depends_on_id, on_failure)
    SELECT later.id, earlier.id, e.on_failure
    FROM unnest(%(edge_steps)s::text[], %(edge_after)s::text[], %(edge_policies)s::text[]) AS e(step, after, on_failure)
    JOIN steps later ON later.step = e.step
    JOIN steps earlier ON earlier.step = e.after
    RETURNING 1
),
notified AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', q.queue) FROM (SELECT DISTINCT queue FROM steps WHERE status = 'queued') q
)
SELECT wf.id, (SELECT count(*) FROM steps) AS steps, (SELECT count(*) FROM edges) AS edges,
       (SELECT count(*) FROM notified) AS notified
FROM wf
"""

workflow_get = "SELECT id, name, steps, created_at, cancelled_at FROM outboxq_workflows WHERE id = %(id)s"

# A workflow's steps (through its index: as many rows as it has steps, whatever the history), each with the
# steps it comes after. A dependency already pruned has no step name left: it finished done.
workflow_steps = """
SELECT j.id, j.step, j.queue, j.status, j.attempts, j.max_attempts, j.result, j.last_error, j.waiting_reason,
       j.worker_id, j.created_at, j.started_at, j.finished_at, j.cancel_requested,
       coalesce((SELECT json_agg(json_build_object('step', dep.step, 'job_id', d.depends_on_id,
                                                   'on_failure', d.on_failure) ORDER BY d.depends_on_id)
                 FROM outboxq_job_dependencies d LEFT JOIN outboxq_jobs dep ON dep.id = d.depends_on_id
                 WHERE d.job_id = j.id), '[]'::json) AS after
FROM outboxq_jobs j
WHERE j.workflow_id = %(id)s
ORDER BY j.id
"""

# The newest workflows (before a given id, for the next page), each with its steps counted by status.
workflow_list = """
SELECT w.id, w.name, w.steps, w.created_at, w.cancelled_at, c.unfinished, c.done, c.dead, c.cancelled
FROM (SELECT * FROM outboxq_workflows
      WHERE %(before)s::bigint IS NULL OR id < %(before)s::bigint
      ORDER BY id DESC LIMIT %(limit)s) w
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE j.status IN ('waiting', 'queued', 'running', 'retrying')) AS unfinished,
           count(*) FILTER (WHERE j.status = 'done') AS done,
           count(*) FILTER (WHERE j.status = 'dead') AS dead,
           count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled
    FROM outboxq_jobs j WHERE j.workflow_id = w.id
) c ON true
ORDER BY w.id DESC
"""

workflow_mark_cancelled = """
UPDATE outboxq_workflows SET cancelled_at = coalesce(cancelled_at, now()) WHERE id = %(id)s RETURNING id
"""

# Every unfinished step cancelled as an operator's cancel does (outboxq.queue.admin.cancel_job): a running one
# is asked to stop, and the worker holding it is woken to stop its handler.
workflow_cancel_steps = f"""
WITH cancelled AS (
    UPDATE outboxq_jobs
    {CANCEL_SET}
    WHERE workflow_id = %(id)s AND status IN ('queued', 'waiting', 'retrying', 'running')
    RETURNING id, status
),
notified AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', '{CANCEL_NOTICE}')
    WHERE EXISTS (SELECT 1 FROM cancelled WHERE status = 'running')
)
SELECT (SELECT count(*) FROM cancelled) AS cancelled, (SELECT count(*) FROM notified) AS notified
"""

# The dead steps run again now, and the steps cancelled because of a failed dependency (cancel_requested false:
# no operator asked) wait again for theirs.
workflow_retry_steps = f"""
WITH retried AS (
    UPDATE outboxq_jobs
    {RETRY_SET}
    WHERE workflow_id = %(id)s AND status = 'dead'
    RETURNING id, queue
),
held AS (
    UPDATE outboxq_jobs
    SET status = 'waiting', finished_at = NULL, waiting_reason = NULL, last_error = NULL
    WHERE workflow_id = %(id)s AND status = 'cancelled' AND NOT cancel_requested
    RETURNING id
),
notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', q.queue) FROM (SELECT DISTINCT queue FROM retried) q)
SELECT (SELECT count(*) FROM retried) AS retried, (SELECT count(*) FROM held) AS waiting,
       (SELECT count(*) FROM notified) AS queues
"""

# A step's place, read when its handler first asks (ctx.workflow_id, ctx.step, ctx.parent_results): its
# workflow, its name, and the results of the steps it comes after, by name.
job_workflow_place = """
SELECT j.workflow_id, j.step,
       coalesce((SELECT jsonb_object_agg(dep.step, dep.result)
                 FROM outboxq_job_dependencies d JOIN outboxq_jobs dep ON dep.id = d.depends_on_id
                 WHERE d.job_id = j.id AND dep.step IS NOT NULL), '{}'::jsonb) AS parent_results
FROM outboxq_jobs j WHERE j.id = %(id)s
"""

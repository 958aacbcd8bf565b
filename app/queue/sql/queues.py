"""Statements on outboxq_queues (pause, failing state, per-queue backoff) and per-queue actions."""

from __future__ import annotations

from outboxq.queue.names import NOTIFY_CHANNEL
from outboxq.queue.sql.jobs import JOB_COLUMNS, RETRY_SET

queue_mark_healthy = """
UPDATE outboxq_queues
SET failing_since = NULL, consecutive_failures = 0, last_success_at = now()
WHERE queue = %(queue)s AND failing_since IS NOT NULL
"""

queue_retry_all_now = f"""
WITH retried AS (
    UPDATE outboxq_jobs
    {RETRY_SET}
    WHERE queue = %(queue)s AND status IN ('retrying', 'dead')
    RETURNING id
)
SELECT count(*) AS retried,
       (SELECT pg_notify('{NOTIFY_CHANNEL}', %(queue)s) WHERE EXISTS (SELECT 1 FROM retried)) AS n
FROM retried
"""

queue_set_paused = """
INSERT INTO outboxq_queues (queue, paused, paused_at)
VALUES (%(queue)s, %(paused)s, CASE WHEN %(paused)s THEN now() END)
ON CONFLICT (queue) DO UPDATE
SET paused = EXCLUDED.paused, paused_at = EXCLUDED.paused_at
"""

queue_list_errors = f"""
SELECT {JOB_COLUMNS} FROM outboxq_jobs
WHERE queue = %(queue)s AND status IN ('retrying', 'dead')
ORDER BY id
LIMIT %(limit)s
"""


queue_failing = """
SELECT queue, failing_since, consecutive_failures FROM outboxq_queues
WHERE failing_since IS NOT NULL ORDER BY queue
"""

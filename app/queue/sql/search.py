"""Statements of the operators' search across queues (GET /v1/jobs) and of the bulk actions over a selection
or a filter (POST /v1/jobs/retry, /v1/jobs/cancel)."""

from __future__ import annotations

from outboxq.queue.names import CANCEL_NOTICE, NOTIFY_CHANNEL
from outboxq.queue.sql.jobs import CANCEL_SET, CANCELLABLE, JOB_COLUMNS_NO_RESULT, RETRIABLE, RETRY_SET

# Every filter is optional (NULL: not applied). Newest first, walking the primary key backwards from `before`
# down to `floor` (the search window: outboxq.queue.search says how far back each kind of filter looks), so a
# filter that matches nothing reads a bounded number of rows, never the whole history. A key filter is a prefix.
JOB_FILTER = """
      (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
  AND (%(key_prefix)s::text IS NULL OR starts_with(j.key, %(key_prefix)s::text))
  AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
  AND (%(error)s::text IS NULL OR strpos(lower(j.last_error), lower(%(error)s::text)) > 0)
  AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR j.created_at < %(until)s::timestamptz)
  AND (%(before)s::bigint IS NULL OR j.id < %(before)s::bigint)
  AND j.id > %(floor)s::bigint"""

# The newest job's id: the search window ends there.
job_newest_id = "SELECT coalesce(max(id), 0) AS id FROM outboxq_jobs"

job_search = f"""
SELECT {JOB_COLUMNS_NO_RESULT}
FROM outboxq_jobs j
WHERE {JOB_FILTER}
ORDER BY j.id DESC
LIMIT %(limit)s
"""

# How many jobs match, up to `limit` (a capped count: it reads at most `limit` matching rows).
job_search_count = f"""
SELECT count(*) AS n FROM (
    SELECT 1 FROM outboxq_jobs j
    WHERE {JOB_FILTER}
    ORDER BY j.id DESC
    LIMIT %(limit)s
) matching
"""

# Bulk actions on the jobs chosen by ids (`ids` not NULL) or by the filter (at most `limit` of them, newest
# first), each only where its status allows it. Their queues (retry) or the workers' heartbeats (cancel of
# running jobs) are woken.
_CHOSEN = f"""
    SELECT j.id FROM outboxq_jobs j
    WHERE CASE WHEN %(ids)s::bigint[] IS NOT NULL THEN j.id = ANY(%(ids)s::bigint[]) ELSE {JOB_FILTER} END
    ORDER BY j.id DESC
    LIMIT %(limit)s"""

job_bulk_retry = f"""
WITH retried AS (
    UPDATE outboxq_jobs
    {RETRY_SET}
    WHERE id IN ({_CHOSEN}) AND status IN {RETRIABLE}
    RETURNING id, queue
),
notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', q.queue) FROM (SELECT DISTINCT queue FROM retried) q)
SELECT (SELECT count(*) FROM retried) AS count, (SELECT count(*) FROM notified) AS queues
"""

job_bulk_cancel = f"""
WITH cancelled AS (
    UPDATE outboxq_jobs
    {CANCEL_SET}
    WHERE id IN ({_CHOSEN}) AND status IN {CANCELLABLE}
    RETURNING id, status
),
notified AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', '{CANCEL_NOTICE}')
    WHERE EXISTS (SELECT 1 FROM cancelled WHERE status = 'running')
)
SELECT (SELECT count(*) FROM cancelled) AS count, (SELECT count(*) FROM notified) AS notified
"""

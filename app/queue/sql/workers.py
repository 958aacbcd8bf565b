"""Statements on outboxq_workers: a worker announces itself (and its jobs in flight), forgets itself when it
stops; the live ones are listed; the long-lapsed ones are pruned."""

from __future__ import annotations

worker_announce = """
INSERT INTO outboxq_workers AS w (id, host, pid, version, queues, concurrency, in_flight)
VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(queues)s::jsonb, %(concurrency)s, %(in_flight)s)
ON CONFLICT (id) DO UPDATE SET in_flight = EXCLUDED.in_flight, queues = EXCLUDED.queues, last_seen_at = now()
"""

worker_forget = "DELETE FROM outboxq_workers WHERE id = %(id)s"

# Live: seen within the lapse (a worker announces itself every few seconds; a killed one stops).
worker_list_live = """
SELECT id, host, pid, version, queues, concurrency, in_flight, started_at, last_seen_at
FROM outboxq_workers
WHERE last_seen_at > now() - %(lapse_s)s * interval '1 second'
ORDER BY started_at, id
LIMIT %(limit)s
"""

worker_prune_lapsed = "DELETE FROM outboxq_workers WHERE last_seen_at < %(before)s"

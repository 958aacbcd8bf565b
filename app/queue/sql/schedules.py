"""Every statement of periodic schedules (workers/scheduler.py, `outboxq periodic`)."""

from __future__ import annotations

# A worker writes the schedules it defines at start. A changed definition starts afresh from the next slot;
# an unchanged one keeps its place (last_slot, next_slot), whichever worker wrote it first.
schedule_upsert = """
INSERT INTO outboxq_schedules AS s (name, queue, spec, timezone, missed, payload, next_slot)
VALUES (%(name)s, %(queue)s, %(spec)s, %(timezone)s, %(missed)s, %(payload)s, %(next_slot)s)
ON CONFLICT (name) DO UPDATE
SET queue = EXCLUDED.queue, spec = EXCLUDED.spec, timezone = EXCLUDED.timezone, missed = EXCLUDED.missed,
    payload = EXCLUDED.payload, updated_at = now(),
    next_slot = CASE WHEN (s.spec, s.timezone) IS DISTINCT FROM (EXCLUDED.spec, EXCLUDED.timezone)
                     THEN EXCLUDED.next_slot ELSE s.next_slot END
"""

# The database's clock, and the soonest slot of these schedules: one cheap statement per idle tick.
schedule_soonest = """
SELECT now() AS now, (SELECT min(next_slot) FROM outboxq_schedules
                      WHERE name = ANY(%(names)s::text[]) AND NOT paused) AS soonest
"""

# The due schedules, locked until the transaction that enqueues their slots' jobs commits; a schedule that
# another worker is enqueueing right now is skipped (it will have moved on when this worker looks again).
schedule_lock_due = """
SELECT name, last_slot, next_slot, now() AS now FROM outboxq_schedules
WHERE name = ANY(%(names)s::text[]) AND next_slot <= now() AND NOT paused
ORDER BY next_slot
FOR UPDATE SKIP LOCKED
"""

schedule_advance = """
UPDATE outboxq_schedules
SET last_slot = coalesce(%(last_slot)s, last_slot), next_slot = %(next_slot)s,
    last_job_id = coalesce(%(last_job_id)s, last_job_id), updated_at = now()
WHERE name = %(name)s
"""

schedule_list = """
SELECT s.name, s.queue, s.spec, s.timezone, s.missed, s.last_slot, s.next_slot, s.last_job_id,
       j.status AS last_job_status, s.updated_at, s.paused
FROM outboxq_schedules s LEFT JOIN outboxq_jobs j ON j.id = s.last_job_id
WHERE %(name)s::text IS NULL OR s.name = %(name)s::text
ORDER BY s.name
"""

schedule_set_paused = """
UPDATE outboxq_schedules SET paused = %(paused)s, updated_at = now() WHERE name = %(name)s
RETURNING name
"""

schedule_payload = "SELECT queue, payload FROM outboxq_schedules WHERE name = %(name)s"

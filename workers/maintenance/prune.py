"""Retention: delete finished jobs in bulk once they are older than the retention periods."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from outboxq.queue import sql
from outboxq.settings import get_settings

BATCH_LIMIT = 5000


def run_once(conn: Any, *, now: datetime | None = None, limit: int = BATCH_LIMIT,
             max_batches: int | None = None) -> int:
    """Delete done and cancelled jobs older than retention_done_s, dead ones older than retention_dead_s,
    Idempotency-Keys older than idempotency_ttl_s, and workflows whose steps are all gone.

    Deletes in batches of `limit`, each committed, until nothing is left or `max_batches` were deleted (the
    maintenance leader deletes one batch per tick); returns how many.
    """
    settings = get_settings()
    now = now or datetime.now(UTC)
    params = {
        "done_before": now - timedelta(seconds=settings.retention_done_s),
        "dead_before": now - timedelta(seconds=settings.retention_dead_s),
        "limit": limit,
    }
    with conn.cursor() as cur:
        cur.execute(sql.idempotency_key_prune,
                    {"before": now - timedelta(seconds=settings.idempotency_ttl_s)})
        cur.execute(sql.workflow_prune_empty, params)
        cur.execute(sql.sequence_prune_finished, params)
        cur.execute(sql.worker_prune_lapsed, {"before": now - timedelta(days=1)})
    conn.commit()
    total = batches = 0
    while True:
        with conn.cursor() as cur:
            cur.execute(sql.job_prune_finished, params)
            deleted = cur.rowcount
        conn.commit()
        total += deleted
        batches += 1
        if deleted < limit or (max_batches is not None and batches >= max_batches):
            return total

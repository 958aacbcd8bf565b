"""Rescue jobs whose lease expired (their worker died, froze or lost the database): retry with backoff, or dead.

Each job follows its own consumer's retry policy (the one its failed attempts follow), decided in Python by
RetryPolicy; a queue whose consumer this process does not know takes the settings' default policy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import dict_row

from outboxq.queue import sql
from outboxq.queue.backoff import RetryPolicy
from outboxq.settings import get_settings
from outboxq.workers.registry import get_consumer

log = logging.getLogger("outboxq.maintenance")

BATCH_LIMIT = 1000


def policy_of_queue(queue: str) -> RetryPolicy:
    """The retry policy of the queue's consumer in this process, else the settings' default."""
    consumer = get_consumer(queue)
    return consumer.retry_policy() if consumer is not None else RetryPolicy.from_settings(get_settings())


def run_once(conn: Any, *, now: datetime | None = None, limit: int = BATCH_LIMIT,
             policy_of: Callable[[str], RetryPolicy] = policy_of_queue) -> list[dict[str, Any]]:
    """Rescue up to `limit` expired jobs in one transaction (committed here); returns id, queue, status."""
    now = now or datetime.now(UTC)
    with conn.cursor(row_factory=dict_row) as cur:
        expired = cur.execute(sql.job_rescue_lock_expired, {"now": now, "limit": limit}).fetchall()
        if not expired:
            conn.commit()
            return []
        decided: dict[str, list[Any]] = {"ids": [], "statuses": [], "delays": [], "errors": []}
        for job in expired:
            policy = policy_of(job["queue"])
            status, delay = (("cancelled", 0.0) if job["cancel_requested"]
                             else policy.decide(job["attempts"], job["max_attempts"]))
            decided["ids"].append(job["id"])
            decided["statuses"].append(status)
            decided["delays"].append(delay)
            decided["errors"].append(f"lease expired: worker {job['worker_id'] or '?'} stopped renewing it")
        rescued = cur.execute(sql.job_rescue_apply, {**decided, "now": now}).fetchall()
    conn.commit()
    for row in rescued:
        log.warning("rescued job %s of queue %s (lease expired): now %s", row["id"], row["queue"], row["status"])
    return rescued

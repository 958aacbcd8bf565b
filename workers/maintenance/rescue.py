"""Rescue jobs whose lease expired (their worker died, froze or lost the database): retry with backoff, or dead.

Each job follows its own consumer's retry policy (the one its failed attempts follow), decided in Python by
RetryPolicy; a queue whose consumer the leader's registry does not know takes the settings' default policy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import dict_row

from outboxq.queue import sql
from outboxq.queue.backoff import RetryPolicy
from outboxq.registry import Registry, default_registry
from outboxq.settings import Settings, get_settings

log = logging.getLogger("outboxq.maintenance")

BATCH_LIMIT = 1000


def policies_of(registry: Registry, settings: Settings) -> Callable[[str], RetryPolicy]:
    """queue -> the retry policy of the queue's consumer in `registry`, else the settings' default."""
    def policy_of(queue: str) -> RetryPolicy:
        consumer = registry.consumer(queue)
        return consumer.retry_policy(settings) if consumer is not None else RetryPolicy.from_settings(settings)

    return policy_of


def policy_of_queue(queue: str) -> RetryPolicy:
    """The retry policy of the queue's consumer in the default registry, else the settings' default."""
    return policies_of(default_registry, get_settings())(queue)


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

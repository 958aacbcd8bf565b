"""Rescue jobs whose lease expired (their worker died, froze or lost the database): retry with backoff, or dead."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import dict_row

from outboxq.queue import sql
from outboxq.settings import get_settings

log = logging.getLogger("outboxq.maintenance")

BATCH_LIMIT = 1000


def run_once(conn: Any, *, now: datetime | None = None, limit: int = BATCH_LIMIT) -> list[dict[str, Any]]:
    """Rescue up to `limit` expired jobs in one transaction (committed here); returns id, queue, status."""
    settings = get_settings()
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            sql.job_rescue_expired,
            {
                "now": now or datetime.now(UTC),
                "limit": limit,
                "backoff_base": settings.backoff_base,
                "backoff_max": settings.backoff_max,
            },
        )
        rescued = cur.fetchall()
    conn.commit()
    for row in rescued:
        log.warning("rescued job %s of queue %s (lease expired): now %s", row["id"], row["queue"], row["status"])
    return rescued

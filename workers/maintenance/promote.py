"""Promote waiting jobs whose dependencies are all done, and keep each waiting job's reason up to date."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from outboxq.queue import sql


def run_once(conn: Any, *, now: datetime | None = None) -> dict[str, int]:
    """One pass (committed here): {"released": n, "reasons_changed": m}.

    Completing a job already releases its dependents in the same statement; this pass is the safety net
    for a dependency that finished while its dependent's transaction was still open, and it records why a
    job cannot run when a dependency is dead or cancelled. Scheduled jobs need no promotion: the claim
    itself skips jobs whose run_at is in the future.
    """
    del now  # dependencies do not depend on the clock; the argument keeps the maintenance interface uniform
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql.job_release_ready_waiting, {})
        released = cur.fetchone()["released"]
        cur.execute(sql.job_update_waiting_reasons, {})
        reasons_changed = len(cur.fetchall())
    conn.commit()
    return {"released": int(released), "reasons_changed": reasons_changed}

"""Promote waiting jobs whose dependencies are all done, and keep each waiting job's reason up to date."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from outboxq.queue import sql

# Links of a chain of on_dependency_failure="cancel" dependents cancelled per pass, at most.
MAX_CANCEL_DEPTH = 100


def run_once(conn: Any, *, now: datetime | None = None) -> dict[str, int]:
    """One pass (committed here): {"released": n, "reasons_changed": m, "cancelled": c}.

    Completing a job already releases its dependents in the same statement; this pass is the safety net
    for a dependency that finished while its dependent's transaction was still open; it applies each link's
    policy when a dependency is dead or cancelled ("run" releases the dependent, "cancel" cancels it and,
    transitively, its own "cancel" dependents; a sequence's link is released once the job before is cancelled),
    and records why the others cannot run. Scheduled jobs need no promotion: the claim itself skips jobs whose
    run_at is in the future.
    """
    del now  # dependencies do not depend on the clock; the argument keeps the maintenance interface uniform
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql.job_release_ready_waiting, {})
        released = cur.fetchone()["released"]
        cancelled = 0
        for _ in range(MAX_CANCEL_DEPTH):  # dependents of a cancelled dependent are cancelled on the next round
            cur.execute(sql.job_cancel_on_failed_dependency, {})
            newly = len(cur.fetchall())
            cancelled += newly
            if not newly:
                break
        cur.execute(sql.job_update_waiting_reasons, {})
        reasons_changed = len(cur.fetchall())
    conn.commit()
    return {"released": int(released), "reasons_changed": reasons_changed, "cancelled": cancelled}

"""Handlers of `python -m tools chaos --scenario limits` (workers import this with `--handlers`).

Two limited queues: chaos-lim-global (global_concurrency=3 across every worker) and chaos-lim-key (at most 2
at once per tenant, limit_by="tenant"). Each attempt records its start in chaos_limit_runs (autocommit, on the
handler thread's own connection), then its effect (chaos_effects, as in the default scenario) and its end in
the job's own transaction (ctx.transaction(), which completes the job when it commits).
"""

from __future__ import annotations

import os
import threading
import time

import psycopg

from outboxq.workers import JobContext, consumer
from tools.chaos_handlers import OPTIONS

GLOBAL_QUEUE, KEY_QUEUE = "chaos-lim-global", "chaos-lim-key"
GLOBAL_LIMIT, KEY_LIMIT = 3, 2
RUNS_DDL = """
CREATE TABLE IF NOT EXISTS chaos_limit_runs (
    job_id bigint NOT NULL,
    attempt int NOT NULL,
    queue text NOT NULL,
    limit_key text,
    pid int NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz
)
"""

_local = threading.local()


def _record(statement: str, params: tuple) -> None:
    """Run one autocommit statement on this thread's connection (reconnecting once if it was cut)."""
    for attempt in (1, 2):
        conn = getattr(_local, "conn", None)
        try:
            if conn is None or conn.closed:
                conn = _local.conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
            conn.execute(statement, params)
            return
        except psycopg.OperationalError:
            if conn is not None:
                conn.close()
            if attempt == 2:
                raise


def run(payload: dict, ctx: JobContext) -> None:
    """Record the start; work payload['work_ms']; write the effect and the end in the job's own transaction
    (fenced: a worker that lost its lease writes neither), so the end is before the slot is released."""
    _record("INSERT INTO chaos_limit_runs (job_id, attempt, queue, limit_key, pid, started_at) "
            "VALUES (%s, %s, %s, %s, %s, clock_timestamp())",
            (ctx.job_id, ctx.attempt, ctx.queue, payload.get("tenant"), os.getpid()))
    time.sleep(payload.get("work_ms", 20) / 1000)
    with ctx.transaction() as conn:  # the effect, the end and the job's completion commit together
        conn.execute("INSERT INTO chaos_effects (tag, job_id, queue, attempt, pid) VALUES (%s, %s, %s, %s, %s)",
                     (payload["tag"], ctx.job_id, ctx.queue, ctx.attempt, os.getpid()))
        conn.execute("UPDATE chaos_limit_runs SET finished_at = clock_timestamp() WHERE job_id = %s AND attempt = %s",
                     (ctx.job_id, ctx.attempt))


consumer(GLOBAL_QUEUE, global_concurrency=GLOBAL_LIMIT, **OPTIONS)(run)
consumer(KEY_QUEUE, global_concurrency=KEY_LIMIT, limit_by="tenant", **OPTIONS)(run)

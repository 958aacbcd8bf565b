"""Handlers for the flow-control tests (subprocess workers import this with `--handlers`).

Each handler records its start and end in test_flow_runs (autocommit, outside the job's transaction), so the
tests read from the database how many ran at once and when each one started.
"""

from __future__ import annotations

import os
import threading
import time

import psycopg

from outboxq.workers import JobContext, consumer

RUNS_DDL = (
    "CREATE TABLE IF NOT EXISTS test_flow_runs (job_id bigint, attempt int, limit_key text, pid int, "
    "started_at timestamptz, finished_at timestamptz)"
)

_local = threading.local()


def _conn() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    return conn


def run(payload: dict, ctx: JobContext) -> None:
    """Record the start, sleep payload['sleep'] seconds (hang on a first attempt when asked), record the end."""
    started = _conn().execute(
        "INSERT INTO test_flow_runs (job_id, attempt, limit_key, pid, started_at) "
        "VALUES (%s, %s, %s, %s, clock_timestamp()) RETURNING started_at",
        (ctx.job_id, ctx.attempt, payload.get("tenant"), os.getpid())).fetchone()
    assert started is not None
    if payload.get("hang_first") and ctx.attempt == 1:
        time.sleep(120)
    time.sleep(payload.get("sleep", 0.0))
    _conn().execute("UPDATE test_flow_runs SET finished_at = clock_timestamp() WHERE job_id = %s AND attempt = %s",
                    (ctx.job_id, ctx.attempt))


consumer("flow_global", global_concurrency=3)(run)
consumer("flow_per_key", global_concurrency=2, limit_by="tenant")(run)
consumer("flow_rate", rate_limit="10/s")(run)
consumer("flow_fair", global_concurrency=1000, limit_by=lambda p: p["tenant"])(run)
consumer("flow_kill", global_concurrency=2, lease_s=1.0, backoff_base=0.1, jitter=0.0)(run)
consumer("flow_runtime", global_concurrency=1)(run)

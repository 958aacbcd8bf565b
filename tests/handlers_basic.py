"""Handlers run by worker subprocesses in the tests (imported with `outboxq worker --handlers`)."""

from __future__ import annotations

import os
import threading
import time

import psycopg

from outboxq.workers import JobContext, consumer

_local = threading.local()


def _log_run(job_id: int, note: str) -> None:
    """Record one execution of a handler, outside the job's transaction, so a double run would show."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    conn.execute("INSERT INTO test_runs (job_id, pid, note) VALUES (%s, %s, %s)", (job_id, os.getpid(), note))


@consumer("count")
def count(payload: dict, ctx: JobContext) -> None:
    """Log that this job ran."""
    _log_run(ctx.job_id, "count")


@consumer("slow", lease_s=30)
def slow(payload: dict, ctx: JobContext) -> None:
    """Runs for payload['seconds'], then logs."""
    _log_run(ctx.job_id, "started")
    time.sleep(payload.get("seconds", 1.0))
    _log_run(ctx.job_id, "finished")


RUNS_TABLE_DDL = "CREATE TABLE IF NOT EXISTS test_runs (job_id bigint, pid int, note text, at timestamptz DEFAULT now())"

"""Spark batches submitted over HTTP (POST /v1/spark/batches): a row to track, a process to run it.

``submit_batch`` records a pending batch in the caller's transaction and starts `outboxq spark run
--batch-id N` in the background once that transaction commits (the launched process waits for the row).
The process drains the queue (until empty) with one Spark application and records its progress on the row.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outboxq.errors import InvalidInput
from outboxq.queue import spark_sql
from outboxq.spark_jobs.consumer import processor_id_for
from outboxq.spark_jobs.delivery import validate_output_table

log = logging.getLogger("outboxq.spark")


def _cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    return conn.cursor(row_factory=dict_row)


def submit_batch(
    conn: psycopg.Connection,
    *,
    queue: str,
    processor: str,
    output_table: str,
    batch_size: int,
    master: str | None = None,
    launch: bool = True,
) -> int:
    """Record a pending batch (in the caller's transaction) and launch its Spark run; returns its id."""
    validate_output_table(output_table)
    if ":" not in processor and "." not in processor:
        raise InvalidInput(f"invalid processor {processor!r}: name it module:function")
    row = _cursor(conn).execute(spark_sql.spark_batch_insert, {
        "queue": queue, "processor": processor, "output_table": output_table, "batch_size": batch_size,
        "master": master,
    }).fetchone()
    batch_id = int(row["id"])
    if launch:
        launch_batch(batch_id)
    return batch_id


def launch_batch(batch_id: int) -> subprocess.Popen:
    """Start `outboxq spark run --batch-id N` in its own session, its output in a log file."""
    log_dir = Path(os.environ.get("OUTBOXQ_SPARK_LOG_DIR") or tempfile.gettempdir())
    log_path = log_dir / f"outboxq-spark-batch-{batch_id}.log"
    with open(log_path, "ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "outboxq.cli", "spark", "run", "--batch-id", str(batch_id)],
            stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    log.info("spark: batch %s launched (pid %s, log %s)", batch_id, process.pid, log_path)
    return process


def get_batch(conn: psycopg.Connection, batch_id: int) -> dict[str, Any] | None:
    """The batch with its state and counts, and the snapshots its processor delivered while it ran."""
    batch = _cursor(conn).execute(spark_sql.spark_batch_get, {"id": batch_id}).fetchone()
    if batch is None:
        return None
    batch = dict(batch)
    batch["processor_id"] = processor_id_for(batch["queue"], batch["processor"], batch["output_table"])
    snapshots = _cursor(conn).execute(spark_sql.spark_snapshot_list_for_batch, {
        "processor_id": batch["processor_id"], "since": batch["started_at"], "until": batch["finished_at"],
    }).fetchall() if batch["started_at"] else []
    batch["snapshots"] = [dict(s) for s in snapshots]
    return batch


def start_batch(conn: psycopg.Connection, batch_id: int, *, wait_s: float = 60.0) -> dict[str, Any]:
    """Mark a pending batch running (waiting for its submitting transaction to commit); its row."""
    deadline = time.monotonic() + wait_s
    while True:
        with conn.transaction():
            row = _cursor(conn).execute(spark_sql.spark_batch_mark_running, {"id": batch_id}).fetchone()
        if row is not None:
            return dict(row)
        existing = _cursor(conn).execute(spark_sql.spark_batch_get, {"id": batch_id}).fetchone()
        conn.rollback()
        if existing is not None:
            raise InvalidInput(f"Spark batch {batch_id} is {existing['state']}, not pending: it runs once")
        if time.monotonic() > deadline:
            raise InvalidInput(f"no Spark batch has id {batch_id}")
        time.sleep(0.2)


def record_progress(conn: psycopg.Connection, batch_id: int, *, jobs_claimed: int, rows_written: int,
                    error: str | None = None) -> None:
    """Add a delivery's counts to the batch (committed)."""
    with conn.transaction():
        conn.execute(spark_sql.spark_batch_add_progress, {
            "id": batch_id, "jobs_claimed": jobs_claimed, "rows_written": rows_written, "error": error})


def finish_batch(conn: psycopg.Connection, batch_id: int, *, error: str | None = None) -> None:
    """Mark the batch done, or failed with the error (committed)."""
    with conn.transaction():
        conn.execute(spark_sql.spark_batch_finish, {
            "id": batch_id, "state": "failed" if error else "done", "error": error})

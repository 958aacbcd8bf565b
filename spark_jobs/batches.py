"""Spark batches submitted over HTTP (POST /v1/spark/batches): a row to track, a process to run it.

``submit_batch`` records a pending batch in the caller's transaction; once that transaction has committed,
``launch_batch`` starts `outboxq spark run --batch-id N` in the background, with only the environment a
Spark driver needs and its log in a folder private to this user. The process waits as `pending` until one
of the ``OUTBOXQ_SPARK_MAX_BATCHES`` batch slots is free, then drains the queue (until empty) with one
Spark application and records its progress on the row.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outboxq.db import DictConnection, one_row
from outboxq.errors import InvalidInput
from outboxq.queue.sql import spark as spark_sql
from outboxq.settings import Settings, get_settings
from outboxq.spark_jobs import registry
from outboxq.spark_jobs.consumer import processor_id_for
from outboxq.spark_jobs.delivery import validate_output_table

log = logging.getLogger("outboxq.spark")

# What a batch's driver process inherits: the system's and Spark's own variables, the outboxq settings a
# consumer reads. Nothing else: no API tokens, no marker secret, none of the API's other secrets.
CHILD_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "KUBECONFIG",
    "OUTBOXQ_SCHEMA", "OUTBOXQ_DB_SCHEMA", "OUTBOXQ_MAX_ATTEMPTS", "OUTBOXQ_BACKOFF_BASE",
    "OUTBOXQ_BACKOFF_MAX", "OUTBOXQ_BACKOFF_JITTER", "OUTBOXQ_POLL_INTERVAL", "OUTBOXQ_LOG_FORMAT",
})
CHILD_ENV_PREFIXES = ("LC_", "OUTBOXQ_SPARK_", "SPARK_", "PYSPARK_", "JAVA_", "HADOOP_", "YARN_")
# How often a pending batch's process looks for a free slot.
SLOT_POLL_S = 0.5


def _cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[dict[str, Any]]:
    return conn.cursor(row_factory=dict_row)


def submit_batch(
    conn: DictConnection,
    *,
    queue: str,
    processor: str,
    output_table: str,
    batch_size: int,
    settings: Settings | None = None,
) -> int:
    """Record a pending batch in the caller's transaction; its id. Launch it once that has committed.

    The processor is a registered name (InvalidInput, listing the names, otherwise)."""
    validate_output_table(output_table)
    registry.registered_spec(processor, settings)
    row = one_row(_cursor(conn).execute(spark_sql.spark_batch_insert, {
        "queue": queue, "processor": processor, "output_table": output_table, "batch_size": batch_size,
        "master": None,
    }))
    return int(row["id"])


def private_log_dir(settings: Settings | None = None) -> Path:
    """The folder batches log to, created readable by this user only; refused if someone else owns it."""
    settings = settings or get_settings()
    path = Path(settings.spark_log_dir or Path(tempfile.gettempdir()) / f"outboxq-spark-{os.getuid()}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise InvalidInput(f"Spark log folder {path} is not a folder of this user")
    if stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(0o700)
    return path


def child_environment(environ: Mapping[str, str], settings: Settings) -> dict[str, str]:
    """The environment of a batch's driver process: the allowed variables of ``environ``, and the API's own
    Spark settings and database (which may have been given to the API in code rather than in environ)."""
    env = {k: v for k, v in environ.items() if k in CHILD_ENV_NAMES or k.startswith(CHILD_ENV_PREFIXES)}
    database_url = settings.database_url or environ.get("DATABASE_URL")
    if database_url:
        env["DATABASE_URL"] = database_url
    env.update({
        "OUTBOXQ_SCHEMA": settings.db_schema,
        "OUTBOXQ_SPARK_MASTER": settings.spark_master,
        "OUTBOXQ_SPARK_CONF": json.dumps(settings.spark_conf),
        "OUTBOXQ_SPARK_PROCESSORS": ",".join(f"{name}={spec}" for name, spec in settings.spark_processors.items()),
        "OUTBOXQ_SPARK_MAX_BATCHES": str(settings.spark_max_batches),
        "OUTBOXQ_SPARK_RESULTS_SCHEMA": settings.spark_results_schema,
    })
    return env


def launch_batch(batch_id: int, settings: Settings | None = None) -> subprocess.Popen:
    """Start `outboxq spark run --batch-id N` (after the batch row committed) in its own session."""
    settings = settings or get_settings()
    log_dir = private_log_dir(settings)
    log_path = log_dir / f"batch-{batch_id}.log"
    env = child_environment(os.environ, settings)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "ab") as output:
        # -P and cwd: the API's working folder is not on the child's import path (a registered processor
        # comes from installed packages or the operator's PYTHONPATH).
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "outboxq.cli", "spark", "run", "--batch-id", str(batch_id)],
            stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env=env, cwd=log_dir,
        )
    log.info("spark: batch %s launched (pid %s, log %s)", batch_id, process.pid, log_path)
    return process


def get_batch(conn: DictConnection, batch_id: int) -> dict[str, Any] | None:
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


def _take_batch_slot(conn: DictConnection, max_batches: int) -> int | None:
    for slot in range(max_batches):
        taken = one_row(_cursor(conn).execute(spark_sql.spark_batch_try_slot, {"slot": slot}))["taken"]
        conn.commit()
        if taken:
            return slot
    return None


def start_batch(conn: DictConnection, batch_id: int, *, settings: Settings | None = None) -> dict[str, Any]:
    """Wait (pending) for a free batch slot, then mark the batch running; its row.

    The slot is a session lock of ``conn``: keep it open while the batch runs. PostgreSQL frees the slot
    when the connection ends, so a batch process that dies does not hold it."""
    settings = settings or get_settings()
    existing = _cursor(conn).execute(spark_sql.spark_batch_get, {"id": batch_id}).fetchone()
    conn.rollback()
    if existing is None:
        raise InvalidInput(f"no Spark batch has id {batch_id}")
    if existing["state"] != "pending":
        raise InvalidInput(f"Spark batch {batch_id} is {existing['state']}, not pending: it runs once")
    while _take_batch_slot(conn, settings.spark_max_batches) is None:
        time.sleep(SLOT_POLL_S)
    with conn.transaction():
        row = _cursor(conn).execute(spark_sql.spark_batch_mark_running, {"id": batch_id}).fetchone()
    if row is None:
        raise InvalidInput(f"Spark batch {batch_id} is no longer pending: it runs once")
    return dict(row)


def record_progress(conn: DictConnection, batch_id: int, *, jobs_claimed: int, rows_written: int,
                    error: str | None = None) -> None:
    """Add a delivery's counts to the batch (committed)."""
    with conn.transaction():
        conn.execute(spark_sql.spark_batch_add_progress, {
            "id": batch_id, "jobs_claimed": jobs_claimed, "rows_written": rows_written, "error": error})


def finish_batch(conn: DictConnection, batch_id: int, *, error: str | None = None) -> None:
    """Mark the batch done, or failed with the error (committed)."""
    with conn.transaction():
        conn.execute(spark_sql.spark_batch_finish, {
            "id": batch_id, "state": "failed" if error else "done", "error": error})

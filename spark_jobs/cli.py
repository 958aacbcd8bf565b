"""`outboxq spark run`: a long-lived Spark consumer of a queue. (Its benchmark, once `outboxq spark bench`, is
run from a checkout: `python -m tools spark-bench`, tools/spark_bench.py.)

Registered by app.cli when this package imports; PySpark itself is imported only when a command runs, so
the command exists (and says what to install) where the spark extra is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from outboxq.errors import InvalidInput

# Fault injection for the crash tests and for operators rehearsing a failure: the process exits at once,
# without cleanup, when it reaches this step (after_snapshot, during_processing, after_write, after_commit);
# or, with STALL_AT, it stops there for good (a hung driver: kill it, or watch another adopt its snapshot).
CRASH_AT_ENV = "OUTBOXQ_SPARK_CRASH_AT"
STALL_AT_ENV = "OUTBOXQ_SPARK_STALL_AT"
CRASH_EXIT_CODE = 70


def crash_hook_from_env() -> Any:
    """A step hook that kills (or stalls) the process at the step named in OUTBOXQ_SPARK_CRASH_AT (STALL_AT)."""
    crash_at, stall_at = os.environ.get(CRASH_AT_ENV), os.environ.get(STALL_AT_ENV)

    def hook(step: str) -> None:
        if step == crash_at:
            sys.stderr.write(f"outboxq spark: crashing at {step} ({CRASH_AT_ENV})\n")
            sys.stderr.flush()
            os._exit(CRASH_EXIT_CODE)
        if step == stall_at:
            sys.stderr.write(f"outboxq spark: stalled at {step} ({STALL_AT_ENV})\n")
            sys.stderr.flush()
            while True:
                time.sleep(3600)

    return hook


def cmd_spark_run(args: argparse.Namespace) -> int:
    """Run a Spark consumer: recover, then claim → process → deliver until stopped (or the queue is empty)."""
    from outboxq.cli import _current_url
    from outboxq.db import connect
    from outboxq.progress import Progress
    from outboxq.spark_jobs import batches, registry

    url = _current_url(wait=True)
    batch_id = args.batch_id
    fields = {"queue": args.queue, "processor": args.processor, "output_table": args.output_table,
              "batch_size": args.batch_size, "master": args.master}
    status_conn = connect(url)
    try:
        if batch_id is not None:
            row = batches.start_batch(status_conn, batch_id)
            # The master (and Spark configuration) of a submitted batch is the operator's: settings or --master.
            fields = {k: (fields[k] if fields[k] is not None or k == "master" else row[k]) for k in fields}
        missing = [f"--{k.replace('_', '-')}" for k in ("queue", "processor", "output_table") if not fields[k]]
        if missing:
            raise InvalidInput(f"spark run needs {', '.join(missing)} (or --batch-id of a submitted batch)")
        try:
            # A submitted batch names a registered processor; the operator's own command may give a path.
            function = registry.load(fields["processor"], allow_path=batch_id is None)
            result = _consume(url, fields, function, args, status_conn, batch_id, Progress(not args.json))
        except BaseException as exc:
            if batch_id is not None:
                batches.finish_batch(status_conn, batch_id, error=f"{type(exc).__name__}: {exc}")
            raise
        if batch_id is not None:
            batches.finish_batch(status_conn, batch_id)
    finally:
        status_conn.close()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"spark: {result['batches']} batches, {result['jobs_completed']} jobs done, "
              f"{result['jobs_failed']} failed, {result['rows_written']} rows written to "
              f"{fields['output_table']} ({result['recovered']} recovered); session start "
              f"{result['session_start_s']:.1f} s, processing {result['processing_s']:.1f} s")
    return 0


def _consume(url: str, fields: dict[str, Any], function: Any, args: argparse.Namespace, status_conn: Any,
             batch_id: int | None, progress: Any) -> dict[str, Any]:
    from outboxq.settings import get_settings
    from outboxq.spark_jobs import batches
    from outboxq.spark_jobs.consumer import Consumer, ConsumerConfig
    from outboxq.spark_jobs.processing import SparkEngine
    from outboxq.spark_jobs.session import build_session, ship_to_executors

    config = ConsumerConfig.from_settings(
        queue=fields["queue"], processor=fields["processor"], output_table=fields["output_table"],
        batch_size=fields["batch_size"], processor_id=args.processor_id, driver_id=args.driver_id,
        error_queue=args.error_queue)
    progress.update("starting Spark…", force=True)
    started = time.perf_counter()
    spark = build_session(fields["master"])
    ship_to_executors(spark, function)
    session_start_s = time.perf_counter() - started
    progress.done(f"Spark session ready in {session_start_s:.1f} s (master {spark.sparkContext.master})")

    reported = {"jobs_claimed": 0, "rows_written": 0}

    def on_batch(stats: Any) -> None:
        progress.update(f"{stats.batches} batches, {stats.jobs_completed} jobs done, "
                        f"{stats.jobs_failed} failed, {stats.rows_written} rows", force=True)
        if batch_id is not None:
            batches.record_progress(status_conn, batch_id,
                                    jobs_claimed=stats.jobs_claimed - reported["jobs_claimed"],
                                    rows_written=stats.rows_written - reported["rows_written"],
                                    error=stats.last_error)
            reported.update(jobs_claimed=stats.jobs_claimed, rows_written=stats.rows_written)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    engine = SparkEngine(spark, function, schema_sample=get_settings().spark_schema_sample)
    consumer = Consumer(url, engine, config, on_step=crash_hook_from_env(),
                        on_batch=on_batch)
    started = time.perf_counter()
    try:
        with consumer:
            stats = consumer.run(until_empty=args.until_empty or batch_id is not None, stop=stop)
    finally:
        spark.stop()
    processing_s = time.perf_counter() - started
    progress.done(f"{stats.batches} batches, {stats.jobs_completed} jobs done in {processing_s:.1f} s")
    return {
        "processor_id": consumer.processor_id, "driver_id": consumer.driver_id, "epoch": consumer.epoch, "batches": stats.batches,
        "recovered": stats.recovered, "lost_snapshots": stats.lost_snapshots, "jobs_claimed": stats.jobs_claimed,
        "jobs_completed": stats.jobs_completed, "jobs_failed": stats.jobs_failed,
        "failed_batches": stats.failed_batches, "rows_written": stats.rows_written,
        "session_start_s": round(session_start_s, 3), "processing_s": round(processing_s, 3),
        "rows_per_s": round(stats.jobs_completed / processing_s, 1) if processing_s else None,
    }


def register(sub: argparse._SubParsersAction) -> None:
    """Add `outboxq spark run` to the outboxq command."""
    parser = sub.add_parser("spark", help="Spark consumers with exactly-once delivery")
    spark_sub = parser.add_subparsers(dest="spark_command", required=True)

    p = spark_sub.add_parser("run", help="consume a queue with a Spark processor (one long-lived application)")
    p.add_argument("--queue", help="the queue to consume")
    p.add_argument("--processor", help="a registered processor name (OUTBOXQ_SPARK_PROCESSORS) or module:function "
                                       "from a DataFrame of payloads to a DataFrame of rows")
    p.add_argument("--output-table", help="the PostgreSQL table the rows go to (created on first use)")
    p.add_argument("--batch-size", type=int, help="jobs per claimed batch (default: settings.spark_batch_size)")
    p.add_argument("--master", help="Spark master URL (default: settings.spark_master, local[*])")
    p.add_argument("--until-empty", action="store_true", help="stop when no job of the queue is due")
    p.add_argument("--batch-id", type=int, help="run a batch submitted with POST /v1/spark/batches")
    p.add_argument("--processor-id", help="the processor's identity (default: from queue, processor, table)")
    p.add_argument("--driver-id", help="this driver's identity; starting it fences an older driver of the same "
                                       "id (default: the processor's first free driver slot)")
    p.add_argument("--error-queue", help="jobs the processor fails on go to this queue (and are dead)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_spark_run)

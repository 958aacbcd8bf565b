"""The "outboxq" streaming sink: a micro-batch's rows into a table (or a queue), their jobs completed with them.

Each partition of a micro-batch is one PostgreSQL transaction: it locks the jobs its rows came from that the
micro-batch's snapshot still holds, writes those jobs' rows (into ``<resultsSchema>.<table>`` with the
delivery hash, or as new jobs of ``enqueueQueue``) and completes them. A job done already (the micro-batch
written before a crash, and replayed) is not held any more: its rows are not written again. A job with a row
whose error column is set is failed alone, with that error, and follows its retry policy. Every row of one
job must be in one partition of the written DataFrame (map, filter, select and explode keep that; after a
shuffle, repartition by job_id).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql as pgsql
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from outboxq.db import DictConnection, connect
from outboxq.errors import InvalidInput
from outboxq.queue import sql as job_sql
from outboxq.queue.backoff import RetryPolicy
from outboxq.queue.enqueue import enqueue_many_written
from outboxq.queue.sql import spark_stream as stream_sql
from outboxq.settings import get_settings
from outboxq.spark_jobs import delivery
from outboxq.spark_jobs.datasource import SourceOptions
from outboxq.spark_jobs.processing import postgres_type

log = logging.getLogger("outboxq.spark")

JOB_ID_COLUMN = "job_id"


@dataclass(slots=True)
class SinkCommit(WriterCommitMessage):
    """What one partition's transaction did."""

    rows_written: int = 0
    jobs_completed: int = 0
    jobs_failed: int = 0
    rows_skipped: int = 0  # rows of jobs done already (a replayed micro-batch) or no longer held


class StreamSink(DataSourceStreamWriter):
    """Writes each partition of a micro-batch, with the completion of its jobs, in one transaction."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        if not options.table and not options.enqueue_queue:
            raise InvalidInput("outboxq sink: give option table (rows into the results schema) or enqueueQueue "
                               "(rows become jobs of that queue)")
        names = schema.fieldNames()
        for needed in (JOB_ID_COLUMN, delivery.DELIVERY_HASH_COLUMN):
            if needed not in names:
                raise InvalidInput(f"outboxq sink: the rows need the source's column {needed!r} (keep it when "
                                   f"transforming the stream): it names the job each row completes")
        self.options = options
        self.columns = [(f.name, postgres_type(f.dataType)) for f in schema.fields
                        if f.name not in (delivery.DELIVERY_HASH_COLUMN, options.error_column)]

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        """One partition: its rows and its jobs' completion (or failure) in one transaction."""
        rows = list(iterator)
        if not rows:
            return SinkCommit()
        with connect(self.options.url) as conn, conn.transaction():
            return write_partition(conn, rows, self.options, self.columns)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log what the micro-batch did (each partition committed on its own)."""
        done = [m for m in messages if isinstance(m, SinkCommit)]
        log.info("spark sink: micro-batch %s: %d rows written, %d jobs done, %d failed, %d rows of jobs done before",
                 batchId, sum(m.rows_written for m in done), sum(m.jobs_completed for m in done),
                 sum(m.jobs_failed for m in done), sum(m.rows_skipped for m in done))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: a partition's transaction committed whole or not at all."""
        log.warning("spark sink: micro-batch %s aborted; its committed partitions stay (their jobs are done)", batchId)


def write_partition(conn: DictConnection, rows: Sequence[Row], options: SourceOptions,
                    columns: Sequence[tuple[str, str]]) -> SinkCommit:
    """Write the rows of the jobs the micro-batch still holds and complete (or fail) those jobs, in the
    caller's transaction."""
    by_job: dict[int, list[Row]] = defaultdict(list)
    errors: dict[int, str] = {}
    hashes: set[str] = set()
    error_column = options.error_column if options.error_column in getattr(rows[0], "__fields__", ()) else None
    for row in rows:
        job_id, hash_ = row[JOB_ID_COLUMN], row[delivery.DELIVERY_HASH_COLUMN]
        if job_id is None or hash_ is None:
            raise InvalidInput("outboxq sink: a row has no job_id or delivery_hash: every row must come from a "
                               "job of the outboxq stream")
        by_job[int(job_id)].append(row)
        hashes.add(str(hash_))
        error = row[error_column] if error_column else None
        if error is not None and int(job_id) not in errors:
            errors[int(job_id)] = str(error)
    held = conn.execute(stream_sql.spark_sink_lock_held, {"ids": sorted(by_job), "hashes": sorted(hashes)}).fetchall()
    held_ids = {int(r["id"]) for r in held}
    good = [r for r in held if int(r["id"]) not in errors]
    bad = [r for r in held if int(r["id"]) in errors]
    good_rows = [row for r in good for row in by_job[int(r["id"])]]
    written = _write_rows(conn, good_rows, options, columns)
    _complete(conn, good, options)
    _fail(conn, bad, errors)
    skipped = sum(len(job_rows) for job_id, job_rows in by_job.items() if job_id not in held_ids)
    return SinkCommit(rows_written=written, jobs_completed=len(good), jobs_failed=len(bad), rows_skipped=skipped)


def _write_rows(conn: DictConnection, rows: Sequence[Row], options: SourceOptions,
                columns: Sequence[tuple[str, str]]) -> int:
    if not rows:
        return 0
    names = [name for name, _ in columns]
    if options.enqueue_queue:
        payloads = [delivery.plain_value({name: row[name] for name in names if name != JOB_ID_COLUMN})
                    for row in rows]
        enqueue_many_written(conn, options.enqueue_queue, payloads, keys=None, run_at=None, delay=None,
                             priority=0, max_attempts=None)
        return len(payloads)
    assert options.table is not None
    delivery.ensure_output_table(conn, options.table, columns, options.results_schema)
    table = pgsql.Identifier(options.results_schema, options.table)
    by_hash: dict[str, list[list[Any]]] = defaultdict(list)
    for row in rows:
        by_hash[row[delivery.DELIVERY_HASH_COLUMN]].append([row[name] for name in names])
    return sum(delivery.copy_results(conn, table, columns, values, hash_) for hash_, values in by_hash.items())


def _complete(conn: DictConnection, held: Sequence[dict[str, Any]], options: SourceOptions) -> None:
    by_lease: dict[Any, list[int]] = defaultdict(list)
    for job in held:
        by_lease[job["lease_token"]].append(int(job["id"]))
    target = (f"queue {options.enqueue_queue}" if options.enqueue_queue
              else f"{options.results_schema}.{options.table}")
    for lease_token, ids in by_lease.items():
        conn.execute(job_sql.job_complete_one_lease, {
            "ids": ids, "lease_token": lease_token, "result": json.dumps({"written": True, "to": target})})


def _fail(conn: DictConnection, held: Sequence[dict[str, Any]], errors: dict[int, str]) -> None:
    if not held:
        return
    policy = RetryPolicy.from_settings(get_settings())
    decisions = [policy.decide(int(job["attempts"]), job["max_attempts"]) for job in held]
    delivery.write_failures(conn, [int(job["id"]) for job in held], [job["lease_token"] for job in held],
                            decisions, [errors[int(job["id"])] for job in held], [None] * len(held),
                            mark_failing=True)

"""The exactly-once core of the Spark consumers, in plain psycopg (no Spark import: tests drive it directly).

The order of the protocol (Cues' algorithm with Gazette's fence, adapted to PostgreSQL). Any number of
drivers of one processor run at once; each has its own id and epoch, and each snapshot its own lease:

1. ``take_driver_slot`` gives a driver without an id of its own a free one; ``register_driver`` bumps that
   id's epoch: an older driver of the same id (a zombie of a restarted driver) is fenced from now on.
2. ``adopt_snapshots`` takes over undelivered snapshots: the driver's own (its predecessor's) at once,
   other drivers' once their lease lapsed; the jobs move to a new lease token, the delivery hash stays.
3. ``claim_snapshot`` claims a batch under a lease and commits its snapshot (job ids + delivery hash)
   before anything is processed.
4. ``deliver`` writes the results with the delivery hash, marks the snapshot delivered and completes the
   jobs, in one transaction fenced by the driver's epoch and the snapshot's lease token (which adoption
   replaces); ``fail_snapshot`` records a failed batch.

``on_step`` hooks name the points where a crash matters; tests raise from them to simulate one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import traceback as traceback_module
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from outboxq.db import DictConnection, one_row
from outboxq.errors import InvalidInput, LeaseLost, OutputTableMismatch
from outboxq.queue import sql as job_sql
from outboxq.queue import storable
from outboxq.queue.backoff import RetryPolicy
from outboxq.queue.sql import spark as spark_sql
from outboxq.spark_jobs import columnar

log = logging.getLogger("outboxq.spark")

OUTPUT_TABLE_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# Output tables live in a schema of their own, never beside (or as) outboxq's tables.
DEFAULT_RESULTS_SCHEMA = "outboxq_results"
DELIVERY_HASH_COLUMN = "delivery_hash"
MAX_ERROR_BYTES = 64 * 1024  # a failed job's error text and traceback, each (the workers' default bound)

# The steps at which the consumer calls its on_step hook (where a crash is worth testing).
STEP_AFTER_SNAPSHOT = "after_snapshot"
STEP_DURING_PROCESSING = "during_processing"
STEP_AFTER_WRITE = "after_write"
STEP_AFTER_COMMIT = "after_commit"

StepHook = Callable[[str], None]


def _no_hook(step: str) -> None:
    return None


class DeliveryFenced(LeaseLost):
    """A claim or delivery was refused: the driver was restarted elsewhere, or the snapshot's lease lost."""


class DriverReplaced(DeliveryFenced):
    """A newer driver with the same id started: this one must stop (every claim and delivery is refused)."""


@dataclass(frozen=True, slots=True)
class SnapshotJob:
    """One claimed job: row_json is its payload with job_id and queue, None if it is not a JSON object."""

    id: int
    queue: str
    attempts: int
    max_attempts: int | None
    row_json: str | None


@dataclass(slots=True)
class Snapshot:
    """A claimed batch, recorded before processing: what a delivery (or a recovery) works on."""

    id: int
    processor_id: str
    driver_id: str
    queue: str
    epoch: int  # the snapshot's own: 1 when claimed, + 1 each time a driver adopts it
    job_ids: list[int]
    lease_token: uuid.UUID
    delivery_hash: str
    output_table: str
    jobs: list[SnapshotJob] = field(default_factory=list)
    recovered: bool = False


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What one delivery wrote: result rows, completed jobs, failed (or error-queued) jobs."""

    snapshot_id: int
    delivery_hash: str
    rows_written: int
    jobs_completed: int
    jobs_failed: int


def delivery_hash(processor_id: str, job_ids: Iterable[int]) -> str:
    """The stable hash of (processor id, sorted job ids): the same for every attempt at the same batch."""
    text = processor_id + "\n" + ",".join(str(i) for i in sorted(set(int(i) for i in job_ids)))
    return hashlib.sha256(text.encode()).hexdigest()


def validate_output_table(name: str) -> str:
    """The output table name, or InvalidInput (a plain identifier of at most 63 characters)."""
    if not isinstance(name, str) or not OUTPUT_TABLE_PATTERN.fullmatch(name):
        raise InvalidInput(f"invalid output table {name!r}: use a letter or _ then up to 62 of A-Z a-z 0-9 _")
    return name


def take_driver_slot(conn: DictConnection, processor_id: str, *, max_slots: int = 10_000) -> str:
    """A driver id of the processor no live driver holds: ``<processor_id>#<slot>``, the lowest free slot.

    The slot is a session lock of ``conn``: it is the driver's for as long as that connection lives, and a
    driver restarted after a crash gets the same id back (and so adopts its predecessor's snapshots at once).
    """
    for slot in range(max_slots):
        row = one_row(_execute(conn, spark_sql.spark_driver_try_slot, {"processor_id": processor_id, "slot": slot}))
        conn.commit()
        if row["taken"]:
            return f"{processor_id}#{slot}"
    raise InvalidInput(f"processor {processor_id!r} has {max_slots} drivers running already")


def release_driver_slot(conn: DictConnection, driver_id: str, processor_id: str) -> None:
    """Give back the slot take_driver_slot() gave `driver_id` on `conn` (before closing it), so that a driver
    restarted at once gets the same id back; an error is ignored (the slot goes when the connection does)."""
    prefix = f"{processor_id}#"
    if not driver_id.startswith(prefix) or not driver_id[len(prefix):].isdigit():
        return  # an id of the caller's choosing holds no slot
    try:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        _execute(conn, spark_sql.spark_driver_release_slot,
                 {"processor_id": processor_id, "slot": int(driver_id[len(prefix):])})
        conn.commit()
    except psycopg.Error as exc:
        log.info("spark: could not release driver slot %s (%s); it is released when the connection ends",
                 driver_id, exc)


def register_driver(conn: DictConnection, driver_id: str, processor_id: str) -> int:
    """Bump the driver's fencing epoch (committed) and return it; its older epochs are fenced from now on."""
    with conn.transaction():
        row = one_row(_execute(conn, spark_sql.spark_driver_bump_epoch,
                               {"driver_id": driver_id, "processor_id": processor_id}))
    return int(row["epoch"])


def check_epoch(conn: DictConnection, driver_id: str, epoch: int) -> None:
    """DriverReplaced unless ``epoch`` is the driver's current one (call it inside the fenced transaction)."""
    row = _execute(conn, spark_sql.spark_driver_lock_epoch, {"driver_id": driver_id}).fetchone()
    current = None if row is None else int(row["epoch"])
    if current != epoch:
        raise DriverReplaced(
            f"driver {driver_id!r} epoch {epoch} is fenced: a newer driver with its id started (epoch {current})"
        )


def _execute(conn: psycopg.Connection[Any], query: Any,
             params: Mapping[str, Any] | None = None) -> psycopg.Cursor[dict[str, Any]]:
    """Run a statement on a dict-row cursor, whatever the connection's own row factory is."""
    return conn.cursor(row_factory=dict_row).execute(query, params)


def _jobs_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[SnapshotJob]:
    jobs = [SnapshotJob(int(r["id"]), r["queue"], int(r["attempts"]), r["max_attempts"], r["row_json"])
            for r in rows]
    return sorted(jobs, key=lambda j: j.id)


def claim_snapshot(
    conn: DictConnection,
    *,
    processor_id: str,
    driver_id: str,
    epoch: int,
    queue: str,
    output_table: str,
    batch_size: int,
    lease_s: float,
    default_max_attempts: int,
    on_step: StepHook = _no_hook,
    id_to: int | None = None,
) -> Snapshot | None:
    """Claim up to batch_size due jobs (with ids up to id_to, when given) under one lease and commit their
    snapshot; None when none are due."""
    validate_output_table(output_table)
    lease_token = uuid.uuid4()
    with conn.transaction():
        check_epoch(conn, driver_id, epoch)
        rows = _execute(conn, spark_sql.spark_jobs_claim if id_to is None else spark_sql.spark_jobs_claim_up_to, {
            "queue": queue, "limit": batch_size, "lease_token": lease_token, "lease_s": lease_s,
            "worker_id": driver_id, "default_max_attempts": default_max_attempts, "id_to": id_to,
        }).fetchall()
        if not rows:
            return None
        jobs = _jobs_from_rows(rows)
        job_ids = [j.id for j in jobs]
        hash_ = delivery_hash(processor_id, job_ids)
        inserted = _execute(conn, spark_sql.spark_snapshot_insert, {
            "processor_id": processor_id, "queue": queue, "job_ids": Jsonb(job_ids), "lease_token": lease_token,
            "delivery_hash": hash_, "output_table": output_table, "driver_id": driver_id, "lease_s": lease_s,
        }).fetchone()
        if inserted is None:
            # Exactly these jobs were already delivered by this processor (an admin re-ran finished jobs):
            # their results are in the output table once, so they complete without a second delivery.
            log.warning("spark: jobs %s were already delivered under %s; completing them", job_ids, hash_)
            _execute(conn, job_sql.job_complete_one_lease, {
                "ids": job_ids, "lease_token": lease_token,
                "result": json.dumps({"delivery_hash": hash_, "jobs": len(job_ids), "already_delivered": True})})
            return None
    snapshot = Snapshot(
        id=int(inserted["id"]), processor_id=processor_id, driver_id=driver_id, queue=queue,
        epoch=int(inserted["epoch"]), job_ids=job_ids, lease_token=lease_token, delivery_hash=hash_, output_table=output_table, jobs=jobs,
    )
    on_step(STEP_AFTER_SNAPSHOT)
    return snapshot


def adopt_snapshots(
    conn: DictConnection,
    *,
    processor_id: str,
    driver_id: str,
    epoch: int,
    lease_s: float,
    default_max_attempts: int,
    limit: int = 1,
) -> list[Snapshot]:
    """Take over up to ``limit`` undelivered snapshots: the driver's own, and others' whose lease lapsed.

    An adopted snapshot keeps its jobs and delivery hash; it gets a new lease token (its old holder is
    fenced) and epoch + 1. A snapshot some of whose jobs finished or were taken by another consumer
    meanwhile (a lease rescue gave them back to the queue and they were claimed again) cannot be delivered
    as it was claimed: it is marked failed and the jobs it still holds go back to the queue, so a batch is
    never split or merged.
    """
    adopted = []
    with conn.transaction():
        check_epoch(conn, driver_id, epoch)
        snapshots = _execute(conn, spark_sql.spark_snapshot_list_adoptable, {
            "processor_id": processor_id, "driver_id": driver_id, "limit": limit}).fetchall()
        for row in snapshots:
            job_ids = [int(i) for i in row["job_ids"]]
            new_lease_token = uuid.uuid4()
            params = {"ids": job_ids, "lease_token": row["lease_token"], "new_lease_token": new_lease_token,
                      "lease_s": lease_s, "worker_id": driver_id, "default_max_attempts": default_max_attempts}
            held = _execute(conn, spark_sql.spark_jobs_relock_for_snapshot, params).fetchall()
            if len(held) != len(job_ids):
                lost = sorted(set(job_ids) - {int(r["id"]) for r in held})
                error = f"abandoned: jobs {lost} finished or were taken over before this snapshot was delivered"
                log.warning("spark: snapshot %s %s", row["id"], error)
                _execute(conn, spark_sql.spark_jobs_release, {"ids": job_ids, "lease_token": new_lease_token})
                _execute(conn, spark_sql.spark_snapshot_mark_failed,
                         {"id": row["id"], "lease_token": row["lease_token"], "error": error})
                continue
            new_epoch = one_row(_execute(conn, spark_sql.spark_snapshot_adopt, {
                "id": row["id"], "lease_token": row["lease_token"], "new_lease_token": new_lease_token,
                "driver_id": driver_id, "lease_s": lease_s}))["epoch"]
            jobs = _jobs_from_rows(_execute(conn, spark_sql.spark_jobs_read_for_snapshot,
                                            {"ids": job_ids, "lease_token": new_lease_token}).fetchall())
            adopted.append(Snapshot(
                id=int(row["id"]), processor_id=processor_id, driver_id=driver_id, queue=row["queue"],
                epoch=int(new_epoch), job_ids=job_ids, lease_token=new_lease_token,
                delivery_hash=row["delivery_hash"], output_table=row["output_table"], jobs=jobs, recovered=True,
            ))
    return adopted


def count_undelivered(conn: DictConnection, processor_id: str) -> int:
    """How many snapshots of the processor are claimed and not yet delivered (by any of its drivers)."""
    with conn.transaction():
        row = one_row(_execute(conn, spark_sql.spark_snapshot_count_claimed, {"processor_id": processor_id}))
    return int(row["claimed"])


def extend_lease(conn: DictConnection, snapshot: Snapshot, lease_s: float) -> bool:
    """Renew the lease of the snapshot and its jobs (committed); False when the snapshot was adopted."""
    with conn.transaction():
        held = _execute(conn, spark_sql.spark_snapshot_extend_lease, {
            "id": snapshot.id, "lease_token": snapshot.lease_token, "lease_s": lease_s}).fetchone()
        _execute(conn, spark_sql.spark_jobs_extend_lease,
                 {"ids": snapshot.job_ids, "lease_token": snapshot.lease_token, "lease_s": lease_s})
    return held is not None


def _postgres_value(value: Any, postgres_type: str) -> Any:
    if value is None:
        return None
    if postgres_type == "jsonb":
        return Jsonb(plain_value(value))
    return value


def plain_value(value: Any) -> Any:
    """A value as JSON can carry it: Spark rows and mappings as objects, bytes as hex, times as ISO text."""
    as_dict = getattr(value, "asDict", None)
    if callable(as_dict):  # a Spark Row (struct)
        value = as_dict(recursive=True)
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_value(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if type(value).__name__ == "Decimal":
        return str(value)
    return value


def ensure_output_table(conn: DictConnection, table: str, columns: Sequence[tuple[str, str]],
                        schema: str = DEFAULT_RESULTS_SCHEMA) -> None:
    """Create schema.table from the result columns plus delivery_hash, or check the existing one."""
    validate_output_table(table)
    wanted = [name for name, _ in columns] + [DELIVERY_HASH_COLUMN]
    where = {"schema": schema, "table": table}
    existing = [r["name"] for r in _execute(conn, spark_sql.spark_output_table_columns, where)]
    if not existing:
        # One creator at a time per results schema (drivers may deliver their first batch at once); the
        # common case, a table that exists, takes no lock.
        _execute(conn, spark_sql.spark_output_table_lock, where)
        existing = [r["name"] for r in _execute(conn, spark_sql.spark_output_table_columns, where)]
    if existing:
        missing = [name for name in wanted if name not in existing]
        if missing:
            raise OutputTableMismatch(f"output table {schema}.{table} exists without the columns {missing}")
        return
    if any(name == DELIVERY_HASH_COLUMN for name, _ in columns):
        raise OutputTableMismatch(f"the results may not have a column named {DELIVERY_HASH_COLUMN!r}")
    qualified = pgsql.Identifier(schema, table)
    definitions = [pgsql.SQL(spark_sql.spark_output_column).format(name=pgsql.Identifier(name),
                                                                   type=pgsql.SQL(postgres_type))
                   for name, postgres_type in columns]
    definitions.append(pgsql.SQL(spark_sql.spark_output_hash_column).format(name=pgsql.Identifier(DELIVERY_HASH_COLUMN)))
    if conn.execute(spark_sql.spark_results_schema_exists, {"schema": schema}).fetchone() is None:
        conn.execute(pgsql.SQL(spark_sql.spark_results_schema_create).format(schema=pgsql.Identifier(schema)))
    conn.execute(pgsql.SQL(spark_sql.spark_output_table_create).format(
        table=qualified, columns=pgsql.SQL(", ").join(definitions)))
    conn.execute(pgsql.SQL(spark_sql.spark_output_table_index).format(
        index=pgsql.Identifier(f"{table[:40]}_delivery_hash_idx"), table=qualified,
        column=pgsql.Identifier(DELIVERY_HASH_COLUMN)))


def deliver(
    conn: DictConnection,
    snapshot: Snapshot,
    *,
    epoch: int,
    columns: Sequence[tuple[str, str]],
    rows: Iterable[Sequence[Any]] | Any,
    failed_jobs: Mapping[int, str] | None = None,
    error_queue: str | None = None,
    retry_policy: RetryPolicy | None = None,
    results_schema: str = DEFAULT_RESULTS_SCHEMA,
    on_step: StepHook = _no_hook,
) -> DeliveryResult:
    """Deliver a snapshot in ONE transaction: results + delivery hash, snapshot delivered, jobs completed.

    ``columns`` are (name, PostgreSQL type) of the result rows (sequences of values, or a pyarrow Table).
    Jobs in ``failed_jobs`` (id -> error) are failed in the same transaction: retried per the backoff (dead
    when out of attempts), or, with an ``error_queue``, moved there as a handled error. Raises
    DeliveryFenced, writing nothing, when the snapshot is no longer this driver's (adopted by another after
    its lease lapsed, or delivered), the driver was restarted elsewhere (DriverReplaced), or a job's lease
    was lost.
    """
    failed_jobs = dict(failed_jobs or {})
    good_ids = [i for i in snapshot.job_ids if i not in failed_jobs]
    with conn.transaction():
        check_epoch(conn, snapshot.driver_id, epoch)
        locked = _execute(conn, spark_sql.spark_snapshot_lock_claimed,
                          {"id": snapshot.id, "lease_token": snapshot.lease_token}).fetchone()
        if locked is None:
            raise DeliveryFenced(f"snapshot {snapshot.id} ({snapshot.delivery_hash[:12]}) is no longer "
                                 "claimed by this lease: it was delivered, failed or taken over")
        rows_written = 0
        if columns:  # no columns: every job failed, there is nothing to write (nor a table to create)
            ensure_output_table(conn, snapshot.output_table, columns, results_schema)
            rows_written = copy_results(conn, pgsql.Identifier(results_schema, snapshot.output_table),
                                         columns, rows, snapshot.delivery_hash)
        _execute(conn, spark_sql.spark_snapshot_mark_delivered, {
            "id": snapshot.id, "lease_token": snapshot.lease_token,
            "rows_written": rows_written, "error": _failed_summary(failed_jobs),
        })
        summary = {"snapshot": snapshot.id, "delivery_hash": snapshot.delivery_hash, "jobs": len(good_ids),
                   "rows_written": rows_written, "output_table": f"{results_schema}.{snapshot.output_table}"}
        completed = [r for r in _execute(conn, job_sql.job_complete_one_lease, {
            "ids": good_ids, "lease_token": snapshot.lease_token, "result": json.dumps(summary)}).fetchall()
            if r["id"] is not None]
        if len(completed) != len(good_ids):
            raise DeliveryFenced(f"snapshot {snapshot.id}: {len(good_ids) - len(completed)} of its jobs lost "
                                 "their lease; nothing was delivered")
        failed_count = _fail_jobs(conn, snapshot, failed_jobs, error_queue=error_queue,
                                  retry_policy=retry_policy, traceback=None)
        if good_ids:
            _execute(conn, job_sql.queue_mark_healthy, {"queue": snapshot.queue})
        on_step(STEP_AFTER_WRITE)
    on_step(STEP_AFTER_COMMIT)
    return DeliveryResult(snapshot.id, snapshot.delivery_hash, rows_written, len(completed), failed_count)


def copy_results(conn: DictConnection, table: pgsql.Identifier, columns: Sequence[tuple[str, str]],
                  rows: Iterable[Sequence[Any]] | Any, hash_: str) -> int:
    """COPY the result rows, each with the delivery hash, into the output table; how many were written.

    A pyarrow Table goes as CSV blocks written by Arrow when CSV carries each of its columns exactly."""
    names = [pgsql.Identifier(name) for name, _ in columns] + [pgsql.Identifier(DELIVERY_HASH_COLUMN)]
    target = {"table": table, "columns": pgsql.SQL(", ").join(names)}
    if columnar.is_arrow_table(rows):
        arrow_table: Any = rows
        if columnar.csv_copyable(arrow_table):
            copy_csv = pgsql.SQL(spark_sql.spark_output_table_copy_csv).format(**target)
            with conn.cursor() as cur, cur.copy(copy_csv) as copy:
                for block in columnar.csv_blocks(arrow_table, hash_):
                    copy.write(block)
            return int(arrow_table.num_rows)
        rows = columnar.table_rows(arrow_table)
    types = [postgres_type for _, postgres_type in columns]
    written = 0
    copy_text = pgsql.SQL(spark_sql.spark_output_table_copy).format(**target)
    with conn.cursor() as cur, cur.copy(copy_text) as copy:
        for row in rows:
            copy.write_row([_postgres_value(v, t) for v, t in zip(row, types, strict=True)] + [hash_])
            written += 1
    return written


def _failed_summary(failed_jobs: Mapping[int, str]) -> str | None:
    if not failed_jobs:
        return None
    first = sorted(failed_jobs.items())[:3]
    details = "; ".join(f"job {job_id}: {error}" for job_id, error in first)
    more = f" (and {len(failed_jobs) - len(first)} more)" if len(failed_jobs) > len(first) else ""
    return f"{len(failed_jobs)} job(s) failed: {details}{more}"


def _fail_jobs(
    conn: DictConnection,
    snapshot: Snapshot,
    failed_jobs: Mapping[int, str],
    *,
    error_queue: str | None,
    retry_policy: RetryPolicy | None,
    traceback: str | None,
) -> int:
    if not failed_jobs:
        return 0
    ids = sorted(failed_jobs)
    # (a processor's error text may hold what PostgreSQL cannot store, NUL say: escaped and cut, not refused)
    errors = [storable.diagnostic_text(failed_jobs[i], MAX_ERROR_BYTES) for i in ids]
    traceback = storable.diagnostic_text(traceback, MAX_ERROR_BYTES)
    if error_queue:  # a handled error: the job is dead at once, its payload and error in the error queue
        _execute(conn, spark_sql.spark_error_queue_insert, {
            "ids": ids, "errors": errors, "lease_token": snapshot.lease_token,
            "error_queue": error_queue, "delivery_hash": snapshot.delivery_hash})
        decisions = [("dead", 0.0)] * len(ids)
    else:
        policy = retry_policy or RetryPolicy()
        claimed = {job.id: job for job in snapshot.jobs}  # attempts as counted by this snapshot's claim
        decisions = [policy.decide(claimed[i].attempts, claimed[i].max_attempts) for i in ids]
    changed = write_failures(conn, ids, [snapshot.lease_token] * len(ids), decisions, errors,
                             [None if error_queue else traceback] * len(ids), mark_failing=not error_queue)
    if len(changed) != len(ids):
        raise DeliveryFenced(f"snapshot {snapshot.id}: {len(ids) - len(changed)} failed jobs lost their lease")
    return len(changed)


def write_failures(conn: DictConnection, ids: Sequence[int], lease_tokens: Sequence[Any],
                   decisions: Sequence[tuple[str, float]], errors: Sequence[str | None],
                   tracebacks: Sequence[str | None], *, mark_failing: bool) -> list[dict[str, Any]]:
    """One failed attempt per job under its lease token (job_fail_batch): its retry decision (status, delay) and
    its error, escaped and cut to MAX_ERROR_BYTES; the rows of the jobs whose lease still held."""
    return _execute(conn, job_sql.job_fail_batch, {
        "ids": list(ids), "lease_tokens": list(lease_tokens),
        "statuses": [status for status, _ in decisions], "delays": [delay for _, delay in decisions],
        "errors": [storable.diagnostic_text(e, MAX_ERROR_BYTES) for e in errors], "tracebacks": list(tracebacks),
        "mark_failing": mark_failing,
    }).fetchall()


def fail_snapshot(
    conn: DictConnection,
    snapshot: Snapshot,
    *,
    epoch: int,
    error: str,
    traceback: str | None = None,
    retry_policy: RetryPolicy | None = None,
    job_errors: Mapping[int, str] | None = None,
) -> int:
    """Record a batch the processor could not handle: every job fails (retry or dead) with the error.

    ``job_errors`` gives some jobs their own error instead (a payload that was not a JSON object)."""
    with conn.transaction():
        check_epoch(conn, snapshot.driver_id, epoch)
        marked = _execute(conn, spark_sql.spark_snapshot_mark_failed, {
            "id": snapshot.id, "lease_token": snapshot.lease_token, "error": error[:10_000],
        }).fetchone()
        if marked is None:
            raise DeliveryFenced(f"snapshot {snapshot.id} is no longer claimed by this lease")
        errors = {**dict.fromkeys(snapshot.job_ids, error), **(job_errors or {})}
        return _fail_jobs(conn, snapshot, errors, error_queue=None,
                          retry_policy=retry_policy, traceback=traceback)


def describe_exception(exc: BaseException) -> tuple[str, str]:
    """(one-line message, traceback text) of an exception, for jobs' last_error and history."""
    message = f"{type(exc).__name__}: {storable.safe_str(exc)}".strip()
    first_line = message.splitlines()[0] if message else type(exc).__name__
    return first_line[:2000], "".join(traceback_module.format_exception(exc))[-20_000:]

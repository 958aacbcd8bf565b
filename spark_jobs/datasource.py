"""outboxq as a Spark data source and sink (format "outboxq"), on PySpark's Python Data Source API.

    from outboxq.spark_jobs import register
    register(spark)
    jobs = spark.read.format("outboxq").option("url", URL).option("queue", "orders").load()      # audits
    stream = spark.readStream.format("outboxq").option("url", URL).option("queue", "orders").load()
    stream.writeStream.format("outboxq").option("url", URL).option("table", "totals") \\
        .option("checkpointLocation", path).start()

A batch read claims nothing. A streaming query claims each micro-batch's jobs as one or more snapshots of
processor ``stream:<name>`` (the Spark consumers' snapshots and delivery hashes, spark_jobs.delivery): the
micro-batch's end offset is the newest snapshot's id, so a micro-batch replayed from Spark's checkpoint reads
exactly the jobs it read before. The query renews their lease while it runs; Spark's commit of a
micro-batch completes the jobs that no written row completed (filtered out). The sink (spark_jobs.sink)
writes a job's rows and completes it in one transaction per partition.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from outboxq.db import DictConnection, connect, normalize_url, url_in_schema
from outboxq.errors import InvalidInput
from outboxq.queue import sql as job_sql
from outboxq.queue.sql import spark as spark_sql
from outboxq.queue.sql import spark_stream as stream_sql
from outboxq.settings import get_settings
from outboxq.spark_jobs import delivery

log = logging.getLogger("outboxq.spark")

FORMAT = "outboxq"
# The columns of a read, batch or streaming (delivery_hash: the micro-batch's, NULL in a batch read).
JOB_COLUMNS = (
    "job_id LONG, queue STRING, key STRING, status STRING, payload STRING, attempts INT, "
    "created_at TIMESTAMP, finished_at TIMESTAMP, result STRING, last_error STRING, delivery_hash STRING"
)
# Snapshots need an output table name; a stream's sink is not known to its source.
STREAM_SNAPSHOT_TABLE = "spark_stream"
NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
# Options Spark itself passes to a data source with the user's: not ours to check.
SPARK_OWN_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})
# How often a running stream says it is alive (outboxq_spark_streams.last_seen_at): well within the lapse
# after which operators see it as stopped (stream_sql.STREAM_LAPSE_S).
HEARTBEAT_S = 10.0
# Spark hands options over in lower case: the names as the documentation spells them, for error messages.
OPTION_NAMES = {"maxjobspertrigger": "maxJobsPerTrigger", "numpartitions": "numPartitions",
                "leaseseconds": "leaseSeconds", "enqueuequeue": "enqueueQueue", "errorcolumn": "errorColumn",
                "resultsschema": "resultsSchema"}


class SourceOptions(BaseModel):
    """The options of format("outboxq"), as Spark passes them (strings, names in any case)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    url: str = Field(min_length=1)
    queue: str | None = Field(default=None, pattern=NAME_PATTERN)
    # A streaming query's name: a restarted query takes over the jobs its predecessor of the same name held.
    # Two queries running at once need two names (the second to start fences the first). Default: the queue.
    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    max_jobs_per_trigger: int = Field(default=10_000, alias="maxjobspertrigger", ge=1, le=1_000_000)
    num_partitions: int = Field(default=2, alias="numpartitions", ge=1, le=1_000)
    lease_seconds: float = Field(default_factory=lambda: get_settings().spark_lease_s, alias="leaseseconds",
                                 gt=0, le=86_400)
    table: str | None = Field(default=None, pattern=f"^{delivery.OUTPUT_TABLE_PATTERN.pattern}$")
    enqueue_queue: str | None = Field(default=None, alias="enqueuequeue", pattern=NAME_PATTERN)
    error_column: str = Field(default="_error", alias="errorcolumn", min_length=1)
    results_schema: str = Field(default_factory=lambda: get_settings().spark_results_schema,
                                alias="resultsschema", pattern=r"^[a-z_][a-z0-9_]{0,62}$")

    @field_validator("url")
    @classmethod
    def _as_outboxq_connects(cls, url: str) -> str:
        # as outboxq.db.database_url(): a SQLAlchemy URL works too, and OUTBOXQ_SCHEMA is on the search path
        return url_in_schema(normalize_url(url), get_settings().db_schema)

    @model_validator(mode="after")
    def _one_target(self) -> SourceOptions:
        if self.table and self.enqueue_queue:
            raise ValueError("give the sink either 'table' or 'enqueueQueue', not both")
        if self.results_schema == get_settings().db_schema:
            raise ValueError(f"option resultsSchema: {self.results_schema!r} is outboxq's own schema; output tables "
                             "go to a schema of their own (default outboxq_results)")
        return self

    @classmethod
    def parse(cls, options: Any) -> SourceOptions:
        """The options, or InvalidInput naming each wrong one and what to give instead."""
        raw = {str(k).lower(): v for k, v in dict(options).items()
               if str(k).lower() not in SPARK_OWN_OPTIONS and not str(k).lower().startswith("spark.")}
        raw.setdefault("url", get_settings().database_url or "")  # (DATABASE_URL or OUTBOXQ_DATABASE_URL)
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(_problem(error) for error in exc.errors())
            known = ", ".join(sorted(OPTION_NAMES.get(f.alias or n, f.alias or n) for n, f in cls.model_fields.items()))
            raise InvalidInput(f"outboxq data source: {problems} (its options: {known})") from None

    def required_queue(self) -> str:
        """The queue to read, or InvalidInput."""
        if not self.queue:
            raise InvalidInput("outboxq data source: option queue is required to read (the queue's name)")
        return self.queue

    @property
    def stream_name(self) -> str:
        """The streaming query's identity (its snapshots' processor and driver id)."""
        return self.name or self.required_queue()


def _problem(error: Any) -> str:
    where = ".".join(OPTION_NAMES.get(str(part), str(part)) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{where!r} is not an option of this format"
    return f"option {where}: {error['msg']}" if where else error["msg"].removeprefix("Value error, ")


class OutboxqDataSource(DataSource):
    """The format "outboxq": read (batch and streaming) the jobs of a queue; write a stream's results."""

    # The Spark application that registered the format (register() bakes it into a subclass): the stream
    # readers run in a Python process of their own, where no SparkContext says it.
    application_id: str | None = None

    @classmethod
    def name(cls) -> str:
        """The format's name."""
        return FORMAT

    def schema(self) -> str:
        """The jobs' columns (for a read; a write takes its DataFrame's own)."""
        return JOB_COLUMNS

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch read of the queue's jobs, in parallel id ranges; it claims nothing."""
        options = SourceOptions.parse(self.options)
        options.required_queue()
        return BatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A stream of the queue's ready jobs, claimed a micro-batch at a time."""
        options = SourceOptions.parse(self.options)
        options.required_queue()
        return StreamReader(options, application_id=self.application_id)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Refused: the sink completes the jobs of a streaming query's micro-batch."""
        raise InvalidInput("outboxq data source: the sink is for streaming queries (writeStream): it completes "
                           "the jobs its rows came from; write a batch DataFrame with Spark's JDBC writer")

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The sink: rows into a table in the results schema, or into a queue, completing their jobs."""
        from outboxq.spark_jobs.sink import StreamSink

        return StreamSink(SourceOptions.parse(self.options), schema)


def register(spark: Any) -> None:
    """Make format("outboxq") known to the session, with filter pushdown for batch reads."""
    # A class made here is pickled with its attributes (by value), so the readers learn the application id.
    of_application = type("OutboxqDataSourceOfApplication", (OutboxqDataSource,),
                          {"application_id": spark.sparkContext.applicationId, "__module__": __name__})
    spark.dataSource.register(of_application)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


# ---------------------------------------------------------------- batch read


@dataclass(slots=True)
class PushedFilters:
    """The filters a batch read runs in PostgreSQL (inclusive bounds; None: not pushed)."""

    statuses: list[str] | None = None
    id_from: int = 0
    id_to: int = 2**63 - 1
    created_from: Any = None
    created_to: Any = None
    finished_from: Any = None
    finished_to: Any = None

    def params(self) -> dict[str, Any]:
        """The statements' parameters."""
        return {"statuses": self.statuses, "id_from": self.id_from, "id_to": self.id_to,
                "created_from": self.created_from, "created_to": self.created_to,
                "finished_from": self.finished_from, "finished_to": self.finished_to}

    def take(self, spark_filter: Filter) -> Literal["all", "partly", "no"]:
        """Push the filter if it can be: "all" (Spark need not check it), "partly" (checked again), "no"."""
        path: tuple[str, ...] = getattr(spark_filter, "attribute", ())  # (every pushed filter has one)
        column = path[0] if len(path) == 1 else None
        if column == "status" and isinstance(spark_filter, EqualTo | In):
            values = [spark_filter.value] if isinstance(spark_filter, EqualTo) else list(spark_filter.value)
            if all(isinstance(v, str) for v in values):
                self.statuses = sorted(set(values) & set(self.statuses)) if self.statuses else sorted(set(values))
                return "all"
            return "no"
        bound = _bound(spark_filter)
        if column is None or bound is None:
            return "no"
        side, strict = bound
        value = getattr(spark_filter, "value", None)
        if column == "job_id" and isinstance(value, int):
            if side == "from":
                self.id_from = max(self.id_from, value + (1 if strict else 0))
            else:
                self.id_to = min(self.id_to, value - (1 if strict else 0))
            return "all"
        if column in ("created_at", "finished_at") and hasattr(value, "isoformat"):
            attribute = f"{column.split('_')[0]}_{side}"
            current = getattr(self, attribute)
            tighter = value if current is None else (max(current, value) if side == "from" else min(current, value))
            setattr(self, attribute, tighter)
            return "partly" if strict else "all"
        return "no"


def _bound(spark_filter: Filter) -> tuple[str, bool] | None:
    if isinstance(spark_filter, GreaterThanOrEqual):
        return "from", False
    if isinstance(spark_filter, GreaterThan):
        return "from", True
    if isinstance(spark_filter, LessThanOrEqual):
        return "to", False
    if isinstance(spark_filter, LessThan):
        return "to", True
    return None


class BatchReader(DataSourceReader):
    """Reads a queue's jobs in numPartitions id ranges, with status, id and time filters run in PostgreSQL."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.pushed = PushedFilters()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Keep the filters PostgreSQL can run; give back those Spark must (still) check."""
        for spark_filter in filters:
            if self.pushed.take(spark_filter) != "all":
                yield spark_filter

    def partitions(self) -> Sequence[InputPartition]:
        """numPartitions id ranges over the queue's (filtered) jobs; none when no job matches."""
        with connect(self.options.url) as conn:
            row = conn.execute(stream_sql.spark_source_id_range,
                               {"queue": self.options.queue, **self.pushed.params()}).fetchone()
        if row is None or row["low"] is None:
            return []
        low, high = int(row["low"]), int(row["high"])
        count = min(self.options.num_partitions, high - low + 1)
        step = -(-(high - low + 1) // count)
        return [InputPartition((start, min(start + step - 1, high))) for start in range(low, high + 1, step)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        """The jobs of one id range."""
        if partition.value is None:  # Spark reads one empty partition where partitions() gave none
            return
        low, high = partition.value
        params = {"queue": self.options.queue, **self.pushed.params(), "low": low, "high": high}
        with connect(self.options.url) as conn, conn.cursor(row_factory=psycopg.rows.tuple_row) as cur:
            yield from cur.execute(stream_sql.spark_source_read_range, params)


# ---------------------------------------------------------------- streaming source


@dataclass(slots=True)
class StreamState:
    """What a running stream reader holds (never pickled to the executors)."""

    conn: DictConnection
    epoch: int
    stop: threading.Event = field(default_factory=threading.Event)
    renewals: int = 0
    keeper: threading.Thread | None = None


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Claims a micro-batch of ready jobs per trigger, under a lease the query renews until Spark commits it."""

    def __init__(self, options: SourceOptions, *, application_id: str | None = None) -> None:
        self.options = options
        self.application_id = application_id
        self.processor_id = f"stream:{options.stream_name}"
        self.available_up_to: int | None = None  # Trigger.AvailableNow: the newest job when the query started
        self._state: StreamState | None = None

    def __getstate__(self) -> dict[str, Any]:
        # read() runs on the executors: they get the options, not the driver's connection and thread
        return {"options": self.options, "processor_id": self.processor_id, "application_id": self.application_id,
                "available_up_to": self.available_up_to, "_state": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # ------------------------------------------------------------ driver side

    def _started(self) -> StreamState:
        if self._state is not None:
            return self._state
        conn = connect(self.options.url)
        epoch = delivery.register_driver(conn, self.processor_id, self.processor_id)
        with conn.transaction():
            conn.execute(stream_sql.spark_stream_register, {
                "name": self.options.stream_name, "queue": self.options.queue, "epoch": epoch,
                "application_id": self.application_id,
                "host": socket.gethostname(), "pid": os.getpid()})
        # this query's predecessor of the same name held these jobs: take them over at once (same hash)
        adopted = delivery.adopt_snapshots(
            conn, processor_id=self.processor_id, driver_id=self.processor_id, epoch=epoch,
            lease_s=self.options.lease_seconds, default_max_attempts=get_settings().max_attempts, limit=10_000)
        if adopted:
            log.info("spark stream %s: took over %d snapshots of its predecessor", self.options.stream_name,
                     len(adopted))
        self._state = StreamState(conn=conn, epoch=epoch)
        self._state.keeper = threading.Thread(target=self._renew_leases, args=(self._state,),
                                              name=f"outboxq-stream-lease-{self.options.stream_name}", daemon=True)
        self._state.keeper.start()
        return self._state

    def initialOffset(self) -> dict:
        """Where a new query starts: after every snapshot of this stream no query holds any more."""
        state = self._started()
        with state.conn.transaction():
            row = state.conn.execute(stream_sql.spark_stream_initial_offset,
                                     {"processor_id": self.processor_id}).fetchone()
        return {"snapshot": int(row["id"]) if row else 0}

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read the jobs there are now (ids up to the newest), then stop."""
        state = self._started()
        with state.conn.transaction():
            row = state.conn.execute(stream_sql.spark_stream_newest_job, {"queue": self.options.queue}).fetchone()
        self.available_up_to = int(row["id"]) if row else 0

    def getDefaultReadLimit(self) -> ReadLimit:
        """At most maxJobsPerTrigger jobs a micro-batch."""
        return ReadMaxRows(self.options.max_jobs_per_trigger)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next micro-batch: a snapshot claimed before Spark recorded it, or a new claim."""
        state = self._started()
        since = int(start.get("snapshot", 0))
        # Spark asks for the next micro-batch once the ones up to start are written (and recorded in its
        # commit log): settle them now, not only at commit(), which Spark calls for the last micro-batch only
        # when a next one comes (never, when a query run with Trigger.AvailableNow ends).
        settle_stream(state.conn, self.processor_id, since, state.epoch)
        with state.conn.transaction():
            unread = state.conn.execute(stream_sql.spark_stream_unread_snapshot,
                                        {"processor_id": self.processor_id, "start": since}).fetchone()
        if unread and unread["id"] is not None:
            return {"snapshot": int(unread["id"])}
        size = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_jobs_per_trigger
        snapshot = delivery.claim_snapshot(
            state.conn, processor_id=self.processor_id, driver_id=self.processor_id, epoch=state.epoch,
            queue=self.options.required_queue(), output_table=STREAM_SNAPSHOT_TABLE, batch_size=max(1, size),
            lease_s=self.options.lease_seconds, default_max_attempts=get_settings().max_attempts,
            id_to=self.available_up_to)
        if snapshot is None:
            return start
        self._progress(state, micro_batches=1, jobs=len(snapshot.job_ids))
        return {"snapshot": snapshot.id}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """The micro-batch's jobs (its snapshots between the offsets), in up to numPartitions pieces each."""
        state = self._started()
        with state.conn.transaction():
            snapshots = state.conn.execute(stream_sql.spark_stream_snapshots_between, {
                "processor_id": self.processor_id, "start": int(start.get("snapshot", 0)),
                "end": int(end.get("snapshot", 0))}).fetchall()
        pieces = []
        for snapshot in snapshots:
            ids = sorted(int(i) for i in snapshot["job_ids"])
            size = -(-len(ids) // self.options.num_partitions)
            pieces += [InputPartition((snapshot["delivery_hash"], ids[i:i + size])) for i in range(0, len(ids), size)]
        return pieces

    def commit(self, end: dict) -> None:
        """Spark finished the micro-batches up to end: settle their snapshots (filtered-out jobs done)."""
        state = self._started()
        settle_stream(state.conn, self.processor_id, int(end.get("snapshot", 0)), state.epoch)

    def reportLatestOffset(self) -> dict | None:
        """Shown in Spark's progress as the source's latest offset: the ready jobs left and lease renewals."""
        state = self._started()
        with state.conn.transaction():
            row = state.conn.execute(stream_sql.spark_stream_ready_count, {"queue": self.options.queue}).fetchone()
        return {"readyJobs": int(row["ready"]) if row else 0, "leaseRenewals": state.renewals}

    def stop(self) -> None:
        """The query stopped: stop renewing (the leases lapse unless it restarts) and say so. Spark may end the
        reader's process before this runs: operators then see the stream stopped once its heartbeat lapses."""
        if self._state is None:
            return
        state, self._state = self._state, None
        state.stop.set()
        try:
            with state.conn.transaction():
                state.conn.execute(stream_sql.spark_stream_stop,
                                   {"name": self.options.stream_name, "epoch": state.epoch})
        except psycopg.Error as exc:
            log.warning("spark stream %s: could not record its stop: %s", self.options.stream_name, exc)
        state.conn.close()

    def _progress(self, state: StreamState, *, micro_batches: int = 0, jobs: int = 0, renewals: int = 0,
                  conn: DictConnection | None = None) -> None:
        conn = conn or state.conn
        with conn.transaction():
            conn.execute(stream_sql.spark_stream_add_progress, {
                "name": self.options.stream_name, "epoch": state.epoch, "micro_batches": micro_batches,
                "jobs": jobs, "renewals": renewals})

    def _renew_leases(self, state: StreamState) -> None:
        # Its own connection: the Spark-facing calls use the reader's. A heartbeat every HEARTBEAT_S (the
        # operators' "running"), the leases every leaseSeconds/3. It never dies on a database error: the next
        # round tries again, and a lapsed lease only means the replayed jobs are not written twice.
        renew_every = self.options.lease_seconds / 3
        last_renewal = time.monotonic()
        while not state.stop.wait(min(HEARTBEAT_S, renew_every)):
            try:
                with connect(self.options.url) as conn:
                    renewed = 0
                    if time.monotonic() - last_renewal >= renew_every * 0.99:
                        renewed = renew_stream_leases(conn, self.processor_id, self.options.lease_seconds)
                        last_renewal = time.monotonic()
                    state.renewals += renewed
                    self._progress(state, renewals=renewed, conn=conn)
            except Exception as exc:  # noqa: BLE001 - logged; the thread must outlive any one failure
                log.warning("spark stream %s: lease renewal failed: %s", self.options.stream_name, exc)

    # ------------------------------------------------------------ executor side

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        """One piece of a snapshot: its jobs as they are now (a replay reads the same jobs)."""
        if partition.value is None:
            return
        hash_, ids = partition.value
        with connect(self.options.url) as conn, conn.cursor(row_factory=psycopg.rows.tuple_row) as cur:
            yield from cur.execute(stream_sql.spark_stream_read_jobs, {"ids": ids, "delivery_hash": hash_})


def renew_stream_leases(conn: DictConnection, processor_id: str, lease_s: float) -> int:
    """Extend the lease of every snapshot the stream holds, and of its jobs; how many snapshots."""
    renewed = 0
    with conn.transaction():
        for snapshot in conn.execute(stream_sql.spark_stream_claimed_snapshots,
                                     {"processor_id": processor_id}).fetchall():
            held = conn.execute(spark_sql.spark_snapshot_extend_lease, {
                "id": snapshot["id"], "lease_token": snapshot["lease_token"], "lease_s": lease_s}).fetchone()
            conn.execute(spark_sql.spark_jobs_extend_lease, {
                "ids": [int(i) for i in snapshot["job_ids"]], "lease_token": snapshot["lease_token"],
                "lease_s": lease_s})
            renewed += held is not None
    return renewed


def settle_stream(conn: DictConnection, processor_id: str, end: int, epoch: int) -> int:
    """Settle the stream's claimed snapshots up to ``end``: complete their jobs no row completed (filtered
    out), mark them delivered. Idempotent: a settled snapshot is not claimed any more. How many settled.
    DriverReplaced, settling nothing, when a newer query of the same name started (epoch fenced)."""
    settled = 0
    with conn.transaction():
        delivery.check_epoch(conn, processor_id, epoch)
        for snapshot in conn.execute(stream_sql.spark_stream_settle_snapshots,
                                     {"processor_id": processor_id, "end": end}).fetchall():
            summary = {"delivery_hash": snapshot["delivery_hash"], "written": False,
                       "reason": "no row of the streaming query's output kept this job"}
            conn.execute(job_sql.job_complete_one_lease, {
                "ids": [int(i) for i in snapshot["job_ids"]], "lease_token": snapshot["lease_token"],
                "result": json.dumps(summary)})
            conn.execute(spark_sql.spark_snapshot_mark_delivered, {
                "id": snapshot["id"], "lease_token": snapshot["lease_token"], "rows_written": None, "error": None})
            settled += 1
    return settled

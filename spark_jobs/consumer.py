"""A long-lived consumer of one queue: (adopt or claim → process → deliver) until stopped or empty.

One consumer is one driver, one Spark application (the session is started once, outside this loop). Any
number of drivers of one processor run at once: each claims its own snapshots, and adopts the snapshots
of a driver that died once their lease lapses. Everything that touches the database is in
spark_jobs.delivery; this module only orders the steps, keeps the leases of a batch alive while Spark
works, and reports progress.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outboxq.db import DictConnection, connect
from outboxq.errors import BatchFailed
from outboxq.queue.backoff import RetryPolicy
from outboxq.settings import Settings, get_settings
from outboxq.spark_jobs import delivery
from outboxq.spark_jobs.delivery import (
    STEP_DURING_PROCESSING,
    DeliveryFenced,
    DriverReplaced,
    Snapshot,
    StepHook,
    _no_hook,
)
from outboxq.spark_jobs.processing import BatchEngine

log = logging.getLogger("outboxq.spark")


def processor_id_for(queue: str, processor: str, output_table: str) -> str:
    """The stable id of a consumer: the same queue, processor and table always recover each other's work."""
    digest = hashlib.sha256(f"{queue}\n{processor}\n{output_table}".encode()).hexdigest()[:12]
    return f"{queue}:{processor}:{output_table}:{digest}"


@dataclass(slots=True)
class ConsumerConfig:
    """What a consumer consumes and where it writes."""

    queue: str
    processor: str
    output_table: str
    batch_size: int = 10_000
    processor_id: str | None = None
    # None: the first free slot of the processor (``<processor_id>#<n>``), so side-by-side drivers differ
    # and a restarted one takes its dead predecessor's place. Starting a driver with an id fences any older
    # driver with the same id.
    driver_id: str | None = None
    lease_s: float = 600.0
    poll_interval: float = 1.0
    error_queue: str | None = None
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    results_schema: str = delivery.DEFAULT_RESULTS_SCHEMA

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **fields) -> ConsumerConfig:
        """A config whose defaults (batch size, lease, retry policy) come from the settings."""
        settings = settings or get_settings()
        defaults: dict[str, Any] = {
            "batch_size": settings.spark_batch_size,
            "lease_s": settings.spark_lease_s,
            "poll_interval": settings.poll_interval,
            "retry_policy": RetryPolicy.from_settings(settings),
            "results_schema": settings.spark_results_schema,
        }
        defaults.update({k: v for k, v in fields.items() if v is not None})
        return cls(**defaults)

    def identity(self) -> str:
        """The processor id (given, or derived from queue, processor and output table)."""
        return self.processor_id or processor_id_for(self.queue, self.processor, self.output_table)


@dataclass(slots=True)
class ConsumerStats:
    """Running totals of a consumer."""

    batches: int = 0
    recovered: int = 0
    jobs_claimed: int = 0
    jobs_completed: int = 0
    jobs_failed: int = 0
    rows_written: int = 0
    failed_batches: int = 0
    lost_snapshots: int = 0
    last_error: str | None = None
    # Seconds spent in each step of the batches: claim (claim + read the jobs; adoption included),
    # process (the engine) and deliver (write, mark delivered, complete the jobs).
    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("claim", "process", "deliver"), 0.0))

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        """Add the time the block takes to ``seconds[step]``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[step] += time.perf_counter() - started


class LeaseKeeper:
    """Renews the lease of a snapshot and its jobs every lease_s/3 on its own connection while Spark works."""

    def __init__(self, url: str, snapshot: Snapshot, lease_s: float) -> None:
        self.url, self.snapshot, self.lease_s = url, snapshot, lease_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{snapshot.id}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                with connect(self.url) as conn:
                    if not delivery.extend_lease(conn, self.snapshot, self.lease_s):
                        log.warning("spark: snapshot %s was adopted by another driver; its delivery here will "
                                    "be refused", self.snapshot.id)
                        return
            except psycopg.Error as exc:  # the next renewal tries again; the delivery is fenced anyway
                log.warning("spark: could not renew the lease of snapshot %s: %s", self.snapshot.id, exc)


class Consumer:
    """Claims, processes and delivers the jobs of one queue with exactly-once effects."""

    def __init__(
        self,
        url: str,
        engine: BatchEngine,
        config: ConsumerConfig,
        *,
        on_step: StepHook = _no_hook,
        on_batch: Callable[[ConsumerStats], None] | None = None,
    ) -> None:
        self.url, self.engine, self.config = url, engine, config
        self.processor_id = config.identity()
        self.on_step = on_step
        self.on_batch = on_batch or (lambda stats: None)
        self.stats = ConsumerStats()
        self.driver_id: str | None = config.driver_id
        self.epoch: int | None = None
        self._conn: DictConnection | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> int:
        """Take a driver id, bump its epoch (fencing an older driver of that id), adopt its snapshots."""
        delivery.validate_output_table(self.config.output_table)
        self._conn = connect(self.url)
        self.driver_id = self.config.driver_id or delivery.take_driver_slot(self._conn, self.processor_id)
        self.epoch = delivery.register_driver(self._conn, self.driver_id, self.processor_id)
        log.info("spark: driver %s started at epoch %s", self.driver_id, self.epoch)
        self.recover()
        return self.epoch

    def close(self) -> None:
        """Give back the driver's slot and close the consumer's connection."""
        if self._conn is not None:
            if self.config.driver_id is None and self.driver_id is not None and not self._conn.closed:
                delivery.release_driver_slot(self._conn, self.driver_id, self.processor_id)
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def conn(self) -> DictConnection:
        """The started driver's connection (RuntimeError before start())."""
        if self._conn is None or self.epoch is None:
            raise RuntimeError("call Consumer.start() first")
        return self._conn

    @property
    def identity(self) -> tuple[str, int]:
        """The started driver's (driver id, epoch) (RuntimeError before start())."""
        if self.driver_id is None or self.epoch is None:
            raise RuntimeError("call Consumer.start() first")
        return self.driver_id, self.epoch

    # ------------------------------------------------------------ the loop

    def recover(self) -> int:
        """Adopt, process and deliver the snapshots this driver may take over (same jobs, same hash).

        One at a time, so that the lease of an adopted snapshot does not run while another is processed."""
        count = 0
        while self.adopt_once():
            count += 1
        return count

    def adopt_once(self) -> bool:
        """Adopt one undelivered snapshot (this driver's own, or one whose lease lapsed) and deliver it."""
        driver_id, epoch = self.identity
        with self.stats.timed("claim"):
            snapshots = delivery.adopt_snapshots(
                self.conn, processor_id=self.processor_id, driver_id=driver_id, epoch=epoch,
                lease_s=self.config.lease_s, default_max_attempts=self.config.retry_policy.max_attempts)
        for snapshot in snapshots:
            log.info("spark: adopting snapshot %s (%d jobs, hash %s, epoch %s)", snapshot.id,
                     len(snapshot.job_ids), snapshot.delivery_hash[:12], snapshot.epoch)
            self._process_and_deliver(snapshot)
            self.stats.recovered += 1
        return bool(snapshots)

    def run_once(self) -> bool:
        """Adopt a lapsed snapshot or claim one batch, process and deliver it; False when nothing was due."""
        if self.adopt_once():
            return True
        driver_id, epoch = self.identity
        with self.stats.timed("claim"):
            snapshot = delivery.claim_snapshot(
                self.conn, processor_id=self.processor_id, driver_id=driver_id, epoch=epoch,
                queue=self.config.queue, output_table=self.config.output_table,
                batch_size=self.config.batch_size, lease_s=self.config.lease_s,
                default_max_attempts=self.config.retry_policy.max_attempts, on_step=self.on_step)
        if snapshot is None:
            return False
        self._process_and_deliver(snapshot)
        return True

    def run(self, *, until_empty: bool = False, stop: threading.Event | None = None,
            max_batches: int | None = None) -> ConsumerStats:
        """Loop until stopped; returns the totals.

        With until_empty, stop once no job is due and no snapshot of the processor is undelivered: while
        another driver still works on one, wait (and adopt it should that driver die)."""
        stop = stop or threading.Event()
        batches = 0
        while not stop.is_set() and (max_batches is None or batches < max_batches):
            try:
                if self.run_once():
                    batches += 1
                    continue
                if until_empty and delivery.count_undelivered(self.conn, self.processor_id) == 0:
                    break
            except psycopg.OperationalError as exc:
                # The database went away (restart, failover, network). Nothing half-done is lost: the
                # snapshot is committed, so reconnecting starts a new epoch and recovers it.
                log.warning("spark: database connection lost (%s); reconnecting", exc)
                self._reconnect(stop)
                continue
            stop.wait(self.config.poll_interval)
        return self.stats

    def _reconnect(self, stop: threading.Event) -> None:
        delay = self.config.poll_interval
        while not stop.is_set():
            self.close()
            try:
                self.start()
                return
            except psycopg.OperationalError as exc:
                log.warning("spark: reconnect failed (%s); retrying in %.1f s", exc, delay)
                stop.wait(delay)
                delay = min(delay * 2, 30.0)

    # ------------------------------------------------------------ one batch

    def _process_and_deliver(self, snapshot: Snapshot) -> None:
        self.stats.jobs_claimed += len(snapshot.job_ids)
        try:
            with LeaseKeeper(self.url, snapshot, self.config.lease_s), self.stats.timed("process"):
                result = self.engine.process(snapshot.jobs, snapshot.delivery_hash)
                self.on_step(STEP_DURING_PROCESSING)
        except BatchFailed as exc:
            try:
                failed = delivery.fail_snapshot(self.conn, snapshot, epoch=self.identity[1], error=str(exc),
                                                traceback=exc.traceback, retry_policy=self.config.retry_policy,
                                                job_errors=exc.job_errors)
            except DriverReplaced:
                raise
            except DeliveryFenced as fenced:
                self._lost(snapshot, fenced)
                return
            log.error("spark: snapshot %s failed (%d jobs back to retry or dead): %s", snapshot.id, failed, exc)
            self.stats.failed_batches += 1
            self.stats.jobs_failed += failed
            self.stats.last_error = str(exc)
            self.on_batch(self.stats)
            return
        try:
            with self.stats.timed("deliver"):
                outcome = delivery.deliver(
                    self.conn, snapshot, epoch=self.identity[1], columns=result.columns, rows=result.rows,
                    failed_jobs=result.failed, error_queue=self.config.error_queue,
                    retry_policy=self.config.retry_policy, results_schema=self.config.results_schema,
                    on_step=self.on_step)
        except DriverReplaced:
            log.error("spark: delivery of snapshot %s refused: driver %s (epoch %s) was restarted elsewhere",
                      snapshot.id, self.driver_id, self.epoch)
            raise
        except DeliveryFenced as fenced:
            self._lost(snapshot, fenced)
            return
        self.stats.batches += 1
        self.stats.jobs_completed += outcome.jobs_completed
        self.stats.jobs_failed += outcome.jobs_failed
        self.stats.rows_written += outcome.rows_written
        if result.failed:
            self.stats.last_error = next(iter(result.failed.values()))
        log.info("spark: delivered snapshot %s: %d rows, %d jobs done, %d failed", snapshot.id,
                 outcome.rows_written, outcome.jobs_completed, outcome.jobs_failed)
        self.on_batch(self.stats)

    def _lost(self, snapshot: Snapshot, fenced: DeliveryFenced) -> None:
        # Another driver adopted the snapshot (this one let its lease lapse): it delivers it, this driver
        # wrote nothing and goes on with other work.
        log.warning("spark: delivery of snapshot %s refused, another driver holds it now: %s", snapshot.id, fenced)
        self.stats.lost_snapshots += 1

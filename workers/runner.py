"""The worker: wake (NOTIFY or poll) → claim a batch (SKIP LOCKED, lease token) → run handlers → complete, fenced.

Threads, each with its own connection:
- the dispatcher claims batches per queue while there is room, and sleeps until notified or a poll is due;
- `concurrency` handler threads run the handlers (async handlers run on one shared event loop);
- the completer writes outcomes in batches: one statement completes every finished job at once;
- the heartbeat renews leases and logs stuck handlers' stacks, and does nothing else: no other work can hold a
  lease renewal back;
- the maintenance thread runs rescue, promote and prune while this worker leads maintenance (one worker at a
  time, chosen by an advisory lock: workers/maintenance/leader.py);
- the scheduler enqueues the slots of the periodic schedules this worker defines (workers/scheduler.py);
- the listener LISTENs for new-work notifications.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue as queue_module
import socket
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outboxq.db import database_url, url_in_schema
from outboxq.queue import limits as flow_limits
from outboxq.queue import limits_sql, sql
from outboxq.queue.schema import CANCEL_NOTICE
from outboxq.settings import Settings, get_settings
from outboxq.workers import executor
from outboxq.workers.context import JobContext
from outboxq.workers.executor import AsyncLoop, ClaimedJob, Outcome
from outboxq.workers.listener import Listener
from outboxq.workers.maintenance.leader import Maintenance
from outboxq.workers.metrics import WorkerMetrics
from outboxq.workers.periodic import Schedule, all_schedules
from outboxq.workers.registry import Consumer, all_consumers
from outboxq.workers.scheduler import Scheduler

log = logging.getLogger("outboxq.worker")

RECONNECT_DELAY_S = 0.5
# A limited queue whose claim came back short is claimed again after this (its slots free up as other
# workers' jobs finish, and its rate window slides), rather than after the poll interval.
LIMITED_RECHECK_S = 0.05


class Worker:
    """Runs the handlers of `consumers` (all registered ones by default) against the database at `url`."""

    def __init__(
        self,
        consumers: Iterable[Consumer] | None = None,
        *,
        url: str | None = None,
        settings: Settings | None = None,
        concurrency: int | None = None,
        batch_size: int | None = None,
        poll_interval: float | None = None,
        worker_id: str | None = None,
        run_maintenance: bool = True,
        listen: bool = True,
        metrics_port: int | None = None,
        schedules: Iterable[Schedule] | None = None,
    ):
        self.settings = settings or get_settings()
        # An explicit url still follows OUTBOXQ_SCHEMA: the worker's connections find outboxq's tables there.
        self.url = url_in_schema(url, self.settings.db_schema) if url else database_url(self.settings)
        self.consumers = {c.queue: c for c in (consumers if consumers is not None else all_consumers())}
        if not self.consumers:
            raise ValueError("a worker needs at least one consumer (@consumer) to run")
        self.concurrency = concurrency or self.settings.concurrency
        self.batch_size = batch_size or self.settings.batch_size
        # Two batches in flight: the next claim overlaps the completion of the previous batch.
        self.max_in_flight = max(2 * self.batch_size, self.concurrency)
        self.poll_interval = poll_interval if poll_interval is not None else self.settings.poll_interval
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.run_maintenance = run_maintenance
        self.listen = listen
        # Periodic schedules: those given, else every one defined in this process (outboxq.periodic).
        self.schedules = list(schedules if schedules is not None else all_schedules())
        self.scheduler: Scheduler | None = None

        self._lock = threading.Lock()
        self._in_flight: dict[int, ClaimedJob] = {}
        self._buffered = 0  # claimed, not yet started
        self._work: queue_module.SimpleQueue[ClaimedJob | None] = queue_module.SimpleQueue()
        self._outcomes: queue_module.SimpleQueue[Outcome | None] = queue_module.SimpleQueue()
        self._wake = threading.Event()
        self._idle_until: dict[str, float] = {q: 0.0 for q in self.consumers}
        self._failing_queues: set[str] = set()
        self._stopping = threading.Event()  # stop claiming
        self._draining = threading.Event()  # handler threads hand back jobs they have not started
        self._finished = threading.Event()  # the completer may exit once outcomes are written
        self._unstarted: list[ClaimedJob] = []
        # Sync handlers still running after their job was abandoned (timed out or cancelled): their stacks are
        # still reported as stuck, their threads end when they return.
        self._abandoned: dict[int, ClaimedJob] = {}
        self._heartbeat_now = threading.Event()  # set on a cancel notice, and to stop the heartbeat
        self._handler_threads = itertools.count()
        self._local = threading.local()
        self._threads: list[threading.Thread] = []
        self._async_loop: AsyncLoop | None = None
        self._listener: Listener | None = None
        self.maintenance: Maintenance | None = None
        self.metrics = WorkerMetrics()
        self.metrics.track_in_flight(lambda: self.in_flight)
        self.metrics_port = metrics_port
        self.stats = {"claimed": 0, "completed": 0, "failed": 0, "fenced": 0, "cancelled": 0}
        # Flow control: the limits of this worker's limited queues (re-read every LIMITS_REFRESH_S), and where
        # each per-key queue's round robin resumes.
        self._limits: dict[str, flow_limits.QueueLimits] = {}
        self._limits_read_at: float | None = None
        self._limit_cursor: dict[str, str] = {}
        self._slots_freed = 0  # completions of limited queues' jobs written so far (the completer counts)
        self._job_seconds: dict[str, float] = {}  # limited queues: mean handler run time (moving average)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Worker:
        """Start every thread and return at once."""
        if self.settings.worker_switch_interval_s > 0:
            # The claim and completion threads wait on the database; with the interpreter's default 5 ms
            # switch interval each of their wake-ups can wait that long for the GIL behind busy handler
            # threads, and the whole pipeline slows down (measured: +15-30% drain throughput at 1 ms).
            sys.setswitchinterval(self.settings.worker_switch_interval_s)
        if any(c.is_async for c in self.consumers.values()):
            self._async_loop = AsyncLoop()
        for _ in range(self.concurrency):
            self._spawn_handler()
        self._spawn(self._completer_loop, "outboxq-completer")
        self._spawn(self._heartbeat_loop, "outboxq-heartbeat")
        if self.metrics_port is not None:
            self.metrics.serve(self.metrics_port)
        if self.run_maintenance:
            self.maintenance = Maintenance(self.url, self.settings, poll_interval=self.poll_interval,
                                           worker_id=self.worker_id).start()
        if self.listen:
            self._listener = Listener(self.url, self._on_notify)
            self._listener.start()
        if self.schedules:
            self.scheduler = Scheduler(self.url, self.schedules).start()
        self._spawn(self._dispatcher_loop, "outboxq-dispatcher")
        log.info("worker %s started: queues %s, concurrency %d, batch %d",
                 self.worker_id, ", ".join(self.consumers), self.concurrency, self.batch_size)
        return self

    def request_stop(self) -> None:
        """Stop claiming new jobs (safe to call from a signal handler)."""
        self._stopping.set()
        self._wake.set()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop claiming, hand back jobs not started, let running handlers finish (bounded), then exit.

        Returns True when every running job finished within the timeout.
        """
        timeout = self.settings.shutdown_timeout if timeout is None else timeout
        self.request_stop()
        if self.scheduler:
            self.scheduler.stop()
        self._draining.set()
        deadline = time.monotonic() + timeout
        for _ in range(self.concurrency):
            self._work.put(None)
        handler_threads = [t for t in self._threads if t.name.startswith("outboxq-handler")]
        for t in handler_threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        clean = not any(t.is_alive() for t in handler_threads)
        if not clean:
            log.warning("shutdown timeout: handlers still running; their leases will expire and be rescued")
        self._release_unstarted()
        self._finished.set()
        self._heartbeat_now.set()
        self._outcomes.put(None)
        for t in self._threads:
            if not t.name.startswith("outboxq-handler"):
                t.join(timeout=max(1.0, deadline - time.monotonic()))
        if self._listener:
            self._listener.stop()
        if self.maintenance:
            self.maintenance.stop()
        if self._async_loop:
            self._async_loop.close()
        log.info("worker %s stopped: %s", self.worker_id, self.stats)
        return clean

    def run(self) -> None:
        """Start and block until request_stop() (for example from SIGTERM), then stop gracefully."""
        self.start()
        while not self._stopping.wait(0.5):
            pass
        self.stop()

    @property
    def in_flight(self) -> int:
        """Jobs this worker holds the lease of (claimed and not yet written back)."""
        with self._lock:
            return len(self._in_flight)

    def _spawn_handler(self) -> None:
        self._spawn(self._handler_loop, f"outboxq-handler-{next(self._handler_threads)}")

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _on_notify(self, queue: str) -> None:
        if queue == CANCEL_NOTICE:
            self._heartbeat_now.set()  # a running job's cancel was requested: the heartbeat reads which
            return
        if queue == "*":
            for q in self._idle_until:
                self._idle_until[q] = 0.0
        elif queue in self._idle_until:
            self._idle_until[queue] = 0.0
        else:
            return
        self._wake.set()

    def _connect(self) -> psycopg.Connection:
        return psycopg.connect(self.url, row_factory=dict_row)

    def _thread_connection(self) -> psycopg.Connection:
        """A connection owned by the calling handler thread (for ctx.transaction())."""
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
            self._local.conn = conn
        return conn

    # ------------------------------------------------------------------ dispatcher: claim

    def _dispatcher_loop(self) -> None:
        conn: psycopg.Connection | None = None
        while not self._stopping.is_set():
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                claimed_any_full = False
                now = time.monotonic()
                if self._limits_read_at is None or now - self._limits_read_at >= flow_limits.LIMITS_REFRESH_S:
                    self._read_limits(conn)
                for queue_name, consumer in self.consumers.items():
                    if self._stopping.is_set() or self._idle_until[queue_name] > now:
                        continue
                    room = self._room()
                    if room <= 0:
                        break
                    limits = self._limits.get(queue_name)
                    slots_freed = self._slots_freed
                    if limits is None:  # no limit: today's claim, nothing more
                        wanted = min(room, self.batch_size)
                        jobs = self.claim(conn, consumer, wanted)
                    else:
                        wanted = min(self._limited_room(limits, room), self.batch_size)
                        if wanted <= 0:
                            continue  # every handler is busy: a completion wakes the dispatcher
                        jobs = self.claim_limited(conn, consumer, limits, wanted)
                    for job in jobs:
                        self._work.put(job)
                    if len(jobs) < wanted and not (limits is not None and self._slots_freed != slots_freed):
                        # (A limited queue whose slot freed while it was being claimed is claimed again at once:
                        # the completer's wake-up came before this claim's short answer.)
                        self._idle_until[queue_name] = time.monotonic() + (
                            self.poll_interval if limits is None else min(self.poll_interval, LIMITED_RECHECK_S))
                    else:
                        claimed_any_full = True
                if claimed_any_full and self._room() > 0:
                    continue
                next_due = min(self._idle_until.values()) - time.monotonic()
                self._wake.wait(timeout=max(0.001, min(self.poll_interval, next_due)) if next_due > 0 else 0.05)
                self._wake.clear()
            except psycopg.Error as exc:
                log.warning("dispatcher: database error (%s); reconnecting", exc)
                if conn is not None:
                    conn.close()
                conn = None
                self._stopping.wait(RECONNECT_DELAY_S)
        if conn is not None:
            conn.close()

    def _room(self) -> int:
        with self._lock:
            in_flight, buffered = len(self._in_flight), self._buffered
        # Claim again only while the handlers risk running dry (a quarter batch left unstarted): fast jobs get
        # the next batch while the last one is being completed; slow jobs are not hoarded by one worker.
        if buffered >= max(self.concurrency, self.batch_size // 4):
            return 0
        return self.max_in_flight - in_flight

    # ------------------------------------------------------------------ flow control (outboxq.queue.limits)

    def _read_limits(self, conn: psycopg.Connection) -> None:
        """Declare this worker's consumers' limits (at start), then read the limits of its queues."""
        if self._limits_read_at is None:
            for consumer in self.consumers.values():
                flow_limits.declare(conn, consumer.limits)
        self._limits = {q: lim for q, lim in flow_limits.load(conn).items()
                        if q in self.consumers and lim.limited}
        conn.commit()
        self._limits_read_at = time.monotonic()

    def _limited_room(self, limits: flow_limits.QueueLimits, room: int) -> int:
        """How many jobs of a limited queue to claim. Where the limit can bind (a rate limit, a concurrency,
        global or per key, below what this worker may hold), only as many as there are idle handlers: a job
        claimed is a job started, so the starts stay within the rate limit and no worker holds slots it cannot
        use."""
        # A concurrency limit (global, or per key) at least what this worker may hold cannot be made to bind by
        # this worker's buffer: claim full batches, as an unlimited queue does (the claim still caps each key).
        if limits.rate_limit_count is None and (limits.global_concurrency is None
                                                or limits.global_concurrency >= self.max_in_flight):
            if not limits.per_key:
                return room
            # Per key: what this worker holds runs before the job of a key that arrives later, so it holds only
            # a short time's work (outboxq.queue.limits.fair_hold), measured from its handlers' run times.
            hold = flow_limits.fair_hold(self.concurrency, self._job_seconds.get(limits.queue), self.max_in_flight)
            with self._lock:
                return min(room, hold - len(self._in_flight))
        with self._lock:
            return min(room, self.concurrency - len(self._in_flight))

    def _claim_into_freed_slots(self, conn: psycopg.Connection, outcomes: list[Outcome]) -> set[str]:
        """Refill the slots of concurrency-bound queues whose jobs just ended, in the transaction that frees them:
        one commit and one hand-off to the dispatcher fewer between a job's end and the next one's start.
        Returns the queues whose freed slots were all refilled."""
        refilled: set[str] = set()
        if not self._limits or self._stopping.is_set():
            return refilled
        for queue_name, limits in self._limits.items():
            if (limits.rate_limit_count is not None or limits.per_key or limits.global_concurrency is None
                    or limits.global_concurrency >= self.max_in_flight):
                continue  # rate limits and per-key rounds stay with the dispatcher
            ended = sum(1 for o in outcomes if o.job.queue == queue_name)
            with self._lock:  # the outcomes' jobs still count in _in_flight until written
                idle = self.concurrency - (len(self._in_flight) - len(outcomes))
            wanted = min(ended, idle)
            if wanted > 0:
                jobs = self.claim_limited(conn, self.consumers[queue_name], limits, wanted)
                for job in jobs:
                    self._work.put(job)
                if len(jobs) == wanted:
                    refilled.add(queue_name)
        return refilled

    def claim_limited(self, conn: psycopg.Connection, consumer: Consumer, limits: flow_limits.QueueLimits,
                      limit: int) -> list[ClaimedJob]:
        """Claim up to `limit` jobs of a limited queue, within its limits (committed).

        The claims of one limited queue take turns (an advisory lock until commit), each counting what runs
        and what started under the previous one."""
        rows: list[dict[str, Any]] = []
        # One round trip for the lock and the claim (a pipeline); still two statements, two snapshots.
        with conn.pipeline():
            conn.execute(limits_sql.queue_limit_claim_lock, {"queue": consumer.queue})
            if not limits.per_key:
                return self.claim(conn, consumer, limit, statement=limits_sql.job_claim_limited)
            after_key = self._limit_cursor.get(consumer.queue, "")
            jobs = self.claim(conn, consumer, limit, statement=limits_sql.job_claim_limited_per_key,
                              params={"after_key": after_key, "max_keys": flow_limits.key_budget(limit)},
                              rows_out=rows)
        if rows:  # the round robin resumes after the last key served
            self._limit_cursor[consumer.queue] = max(rows, key=lambda r: r["limit_key_pos"])["limit_key"]
            # Handlers take the batch in round-robin order too (every key's first job, then every key's second...):
            # a key that just arrived does not wait behind another key's share of the batch.
            turn = {r["id"]: (r["limit_key_turn"], r["limit_key_pos"]) for r in rows}
            jobs.sort(key=lambda job: turn[job.id])
        return jobs

    def claim(self, conn: psycopg.Connection, consumer: Consumer, limit: int,
              statement: str = sql.job_claim_batch, params: dict[str, Any] | None = None,
              rows_out: list[dict[str, Any]] | None = None) -> list[ClaimedJob]:
        """Claim up to `limit` jobs of the consumer's queue under a fresh lease token (committed)."""
        lease_token = uuid.uuid4()
        lease_s = consumer.effective_lease_s(self.settings)
        policy = consumer.retry_policy(self.settings)
        rows = conn.execute(
            statement,
            {
                "queue": consumer.queue,
                "limit": limit,
                "lease_token": lease_token,
                "lease_s": lease_s,
                "worker_id": self.worker_id,
                "default_max_attempts": policy.max_attempts,
                **(params or {}),
            },
        ).fetchall()
        conn.commit()
        if rows_out is not None:
            rows_out.extend(rows)
        if not rows:
            return []
        if rows[0]["queue_failing"]:
            self._failing_queues.add(consumer.queue)
        # UPDATE ... RETURNING gives no order: hand jobs to the handlers in claim order (priority first).
        rows.sort(key=lambda r: (r["priority"], r["run_at"], r["id"]))
        jobs = []
        for r in rows:
            payload = r["payload"] if r["payload_bytes"] is None else bytes(r["payload_bytes"])
            job = ClaimedJob(
                id=r["id"], queue=r["queue"], key=r["key"], payload=payload, attempts=r["attempts"],
                max_attempts=r["max_attempts"], lease_token=lease_token, context=r["context"],
                consumer=consumer,
            )
            job.ctx = JobContext(
                job_id=job.id, queue=job.queue, key=job.key, attempt=job.attempts,
                max_attempts=job.max_attempts, lease_token=lease_token, consumer_id=consumer.id,
                captured_context=job.context, connection_factory=self._thread_connection,
            )
            jobs.append(job)
        with self._lock:
            for job in jobs:
                self._in_flight[job.id] = job
            self._buffered += len(jobs)
        self.stats["claimed"] += len(jobs)
        return jobs

    # ------------------------------------------------------------------ handlers

    def _handler_loop(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            with self._lock:
                self._buffered -= 1
            if self._draining.is_set():
                with self._lock:
                    self._unstarted.append(job)
                continue
            self.metrics.job_started(job)
            outcome = executor.execute(job, self._async_loop)
            with self._lock:
                abandoned = job.abandoned
                job.finished = True  # no more heartbeats or stack dumps for it
                self._abandoned.pop(job.id, None)
            if not abandoned:
                self._outcomes.put(outcome)
            elif not job.consumer.is_async:
                return  # a new handler thread took this one's place when the job was abandoned

    def _release_unstarted(self) -> None:
        while True:  # jobs still in the work queue were never started either
            try:
                job = self._work.get_nowait()
            except queue_module.Empty:
                break
            if job is not None:
                self._unstarted.append(job)
        if not self._unstarted:
            return
        try:
            with self._connect() as conn:
                conn.execute(sql.job_release_unstarted, {
                    "ids": [j.id for j in self._unstarted],
                    "lease_tokens": [j.lease_token for j in self._unstarted],
                })
            log.info("handed back %d claimed jobs that had not started", len(self._unstarted))
        except psycopg.Error as exc:
            log.warning("could not hand back %d unstarted jobs (%s): they will be rescued when their "
                        "leases expire", len(self._unstarted), exc)
        with self._lock:
            for job in self._unstarted:
                self._in_flight.pop(job.id, None)
        self._unstarted.clear()

    # ------------------------------------------------------------------ completer

    def _completer_loop(self) -> None:
        conn: psycopg.Connection | None = None
        pending: list[Outcome] = []
        give_up_at: float | None = None
        while True:
            try:
                item = self._outcomes.get(timeout=0.2)
            except queue_module.Empty:
                item = None
            if item is not None:
                pending.append(item)
            while True:  # take everything that is ready: one write for all of it
                try:
                    more = self._outcomes.get_nowait()
                except queue_module.Empty:
                    break
                if more is not None:
                    pending.append(more)
            if pending:
                try:
                    if conn is None or conn.closed:
                        conn = self._connect()
                    self.write_outcomes(conn, pending)
                    self.metrics.jobs_finished(pending)
                    pending = []
                except psycopg.Error as exc:
                    log.warning("completer: database error (%s); retrying", exc)
                    if conn is not None:
                        conn.close()
                    conn = None
                    if self._finished.is_set():
                        # Shutting down with the database away: give up after a while; the leases will
                        # expire and the jobs be rescued.
                        give_up_at = give_up_at or time.monotonic() + 5.0
                        if time.monotonic() > give_up_at:
                            break
                    time.sleep(RECONNECT_DELAY_S)
                    continue
            if self._finished.is_set() and not pending and self._outcomes.empty():
                break
        if conn is not None:
            conn.close()

    def write_outcomes(self, conn: psycopg.Connection, outcomes: list[Outcome]) -> None:
        """Write every outcome in one transaction: one statement completes all the successes."""
        to_complete = [o for o in outcomes if o.succeeded and not o.completed_in_transaction and not o.fenced]
        completed_ids: set[int] = set()
        with_results = [o for o in outcomes if o.succeeded and not o.fenced and o.result_json is not None]
        if with_results:
            conn.execute(sql.job_store_results, {
                "ids": [o.job.id for o in with_results],
                "lease_tokens": [None if o.completed_in_transaction else o.job.lease_token for o in with_results],
                "results": [o.result_json for o in with_results],
            })
        if to_complete:
            rows = conn.execute(sql.job_complete_batch, {
                "ids": [o.job.id for o in to_complete],
                "lease_tokens": [o.job.lease_token for o in to_complete],
            }).fetchall()
            completed_ids = {r["id"] for r in rows if r["id"] is not None}
        failed_writes = []
        to_fail: list[Outcome] = []
        for o in outcomes:
            if o.fenced or o.succeeded:
                continue
            if o.cancelled:
                failed_writes.append((o, conn.execute(sql.job_finish_cancelled, {
                    "id": o.job.id, "lease_token": o.job.lease_token}).fetchone()))
                continue
            if o.snooze_s is not None:
                failed_writes.append((o, conn.execute(sql.job_snooze, {
                    "id": o.job.id, "lease_token": o.job.lease_token, "delay": o.snooze_s,
                    "error": o.error}).fetchone()))
                continue
            to_fail.append(o)
        if to_fail:
            decisions = [o.job.consumer.retry_policy(self.settings).decide(o.job.attempts, o.job.max_attempts)
                         for o in to_fail]
            rows = {r["id"]: r for r in conn.execute(sql.job_fail_batch, {
                "ids": [o.job.id for o in to_fail], "lease_tokens": [o.job.lease_token for o in to_fail],
                "statuses": [status for status, _ in decisions], "delays": [delay for _, delay in decisions],
                "errors": [o.error or "failed" for o in to_fail], "tracebacks": [o.traceback for o in to_fail],
                "mark_failing": True,
            }).fetchall()}
            failed_writes += [(o, rows.get(o.job.id)) for o in to_fail]
        succeeded_queues = {o.job.queue for o in outcomes if o.succeeded and not o.fenced}
        for queue_name in succeeded_queues & self._failing_queues:
            conn.execute(sql.queue_mark_healthy, {"queue": queue_name})
        refilled = self._claim_into_freed_slots(conn, outcomes)  # flow control: commits with the outcomes
        conn.commit()
        self._failing_queues -= succeeded_queues

        for o in to_complete:
            if o.job.id in completed_ids:
                self.stats["completed"] += 1
            else:
                self._log_fenced(o, "completion")
        for o, row in failed_writes:
            if row is None:
                self._log_fenced(o, "cancel" if o.cancelled else "failure")
            elif o.cancelled:
                self.stats["cancelled"] += 1
            elif o.snooze_s is not None:
                o.job.ctx.log.info("job %s snoozed for %g s", o.job.id, o.snooze_s)
            else:
                self.stats["failed"] += 1
                o.job.ctx.log.warning("job %s attempt %d failed (%s): now %s", o.job.id, o.job.attempts,
                                      o.error, row["status"])
        for o in outcomes:
            if o.fenced:
                self._log_fenced(o, "effects")
            elif o.completed_in_transaction:
                self.stats["completed"] += 1
        with self._lock:
            for o in outcomes:
                self._in_flight.pop(o.job.id, None)
        freed = {o.job.queue for o in outcomes} & self._limits.keys()
        for queue_name in freed:
            durations = [o.duration_s for o in outcomes if o.job.queue == queue_name]
            mean, before = sum(durations) / len(durations), self._job_seconds.get(queue_name)
            self._job_seconds[queue_name] = mean if before is None else 0.7 * before + 0.3 * mean
        freed -= refilled  # (the slots refilled above need no claim from the dispatcher)
        if freed:
            self._slots_freed += 1
        for queue_name in freed:
            self._idle_until[queue_name] = 0.0  # a slot of a limited queue is free: claim again now
        self._wake.set()

    def _log_fenced(self, outcome: Outcome, what: str) -> None:
        self.stats["fenced"] += 1
        (outcome.job.ctx.log if outcome.job.ctx is not None else log).warning("job %s: %s refused, this worker was fenced (its lease %s was taken away)",
                    outcome.job.id, what, outcome.job.lease_token)

    # ------------------------------------------------------------------ heartbeat: leases and stuck handlers

    def _heartbeat_loop(self) -> None:
        conn: psycopg.Connection | None = None
        min_lease = min(c.effective_lease_s(self.settings) for c in self.consumers.values())
        heartbeat_every = max(0.05, min_lease / 3)
        tick = max(0.05, min(0.5, heartbeat_every))
        last_heartbeat = 0.0
        while not self._finished.is_set():
            now = time.monotonic()
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                if now - last_heartbeat >= heartbeat_every:
                    self._heartbeat(conn)
                    last_heartbeat = now
                self._check_stuck(now)
            except psycopg.Error as exc:
                log.warning("heartbeat: database error (%s); reconnecting", exc)
                if conn is not None:
                    conn.close()
                conn = None
            if self._heartbeat_now.wait(tick):
                self._heartbeat_now.clear()
                last_heartbeat = 0.0
        if conn is not None:
            conn.close()

    def _heartbeat(self, conn: psycopg.Connection) -> None:
        with self._lock:
            running = [j for j in self._in_flight.values() if not j.finished]
        if not running:
            return
        by_lease: dict[float, list[ClaimedJob]] = defaultdict(list)
        for job in running:
            by_lease[job.consumer.effective_lease_s(self.settings)].append(job)
        alive: dict[int, bool] = {}
        for lease_s, jobs in by_lease.items():
            rows = conn.execute(sql.job_heartbeat, {
                "ids": [j.id for j in jobs], "lease_tokens": [j.lease_token for j in jobs], "lease_s": lease_s,
            }).fetchall()
            alive.update({r["id"]: r["cancel_requested"] for r in rows})
        conn.commit()
        with self._lock:
            still_held = set(self._in_flight)
        for job in running:
            if job.id not in still_held or job.ctx is None:
                continue  # written back meanwhile
            if job.id not in alive:
                if not job.ctx.fenced:
                    job.ctx.fenced = True
                    job.ctx.request_cancel()
                    job.ctx.log.warning("job %s: lease lost (fenced); the handler's writes will be refused",
                                        job.id)
            elif alive[job.id]:
                job.ctx.request_cancel()
                self._abandon(job, Outcome(job=job, succeeded=False, error="cancelled while running",
                                           cancelled=True))

    def _check_stuck(self, now: float) -> None:
        """Log stuck handlers' stacks, and give up on attempts past their consumer's timeout."""
        with self._lock:
            started = [j for j in self._in_flight.values() if j.started_monotonic is not None and not j.finished]
            started += self._abandoned.values()
        for job in started:
            executor.report_stuck(job, now)
            timeout = job.consumer.effective_timeout_s(self.settings)
            if timeout is not None and not job.abandoned and now - job.started_monotonic > timeout:  # type: ignore[operator]
                self._abandon(job, Outcome(job=job, succeeded=False, error=f"timed out after {timeout:g} s "
                                           "(the consumer's timeout)", duration_s=now - job.started_monotonic))  # type: ignore[operator]

    def _abandon(self, job: ClaimedJob, outcome: Outcome) -> None:
        """Stop waiting for a running handler: write `outcome` (failed or cancelled; the write revokes the
        lease, so the handler's later ctx.transaction() is refused), cancel an async handler's task, and give
        a sync handler's slot to a new thread (Python cannot stop the old one; it ends when the handler
        returns)."""
        with self._lock:
            if job.finished or job.abandoned:
                return
            job.abandoned = True
            if not job.consumer.is_async:
                self._abandoned[job.id] = job
        assert job.ctx is not None
        job.ctx.request_cancel()
        if job.task is not None and self._async_loop is not None:
            self._async_loop.loop.call_soon_threadsafe(job.task.cancel)
        self._outcomes.put(outcome)
        if not job.consumer.is_async:
            self._spawn_handler()
        job.ctx.log.warning("job %s: %s; %s", job.id, outcome.error,
                            "its task was cancelled" if job.consumer.is_async else
                            "its lease is revoked and its handler slot given to a new thread")

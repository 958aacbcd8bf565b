"""What a worker's rooms share: its configuration, the jobs it holds, and the queues and events between rooms.

Each room (dispatcher, handler threads, completer, heartbeat) owns its loop and its connection; what crosses
from one room to another goes through this object, under its lock where a field is read and written by more
than one thread. Every room's loop, the scheduler's, listener's and maintenance's too, runs under the guard of
workers/rooms.py, which keeps it running through the errors it can recover from and stops the worker on the
others.
"""

from __future__ import annotations

import queue as queue_module
import threading

import psycopg
from psycopg.rows import dict_row

from outboxq.db import DictConnection, with_fast_json
from outboxq.queue import limits as flow_limits
from outboxq.queue import sql
from outboxq.settings import Settings
from outboxq.workers.executor import AsyncLoop, ClaimedJob, Outcome
from outboxq.workers.metrics import WorkerMetrics
from outboxq.workers.registry import Consumer
from outboxq.workers.rooms import Rooms

RECONNECT_DELAY_S = 0.5


class WorkerState:
    """A worker's configuration and the state its rooms share."""

    def __init__(self, *, url: str, settings: Settings, consumers: dict[str, Consumer], worker_id: str,
                 concurrency: int, batch_size: int, poll_interval: float):
        self.url = url
        self.settings = settings
        self.consumers = consumers
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.batch_size = batch_size
        # Two batches in flight: the next claim overlaps the completion of the previous batch.
        self.max_in_flight = max(2 * batch_size, concurrency)
        # A limited queue's claims are larger (outboxq.queue.limits.claim_size) and, where its limit cannot bind
        # in this worker, it may hold two of them, for the same reason: with one, a full claim had to wait for
        # every job before it to be written, and the per-key drain claimed far fewer jobs at a time.
        self.limited_claim_size = flow_limits.claim_size(batch_size, self.max_in_flight)
        self.max_in_flight_limited = max(self.max_in_flight, 2 * self.limited_claim_size)
        # Claim again once fewer claimed jobs than this wait for a handler: fast jobs get the next batch while the
        # last one is being run and completed; slow jobs are not hoarded by one worker.
        self.refill_below = max(concurrency, batch_size // 4)
        self.poll_interval = poll_interval

        self.lock = threading.Lock()
        # Guarded by `lock`: the jobs this worker holds the lease of, how many are claimed and not yet started,
        # and sync handlers still running after their job was abandoned (timed out or cancelled: their stacks
        # are still reported as stuck, their threads end when they return).
        self.in_flight: dict[int, ClaimedJob] = {}
        self.buffered = 0
        self.abandoned: dict[int, ClaimedJob] = {}

        self.work: queue_module.SimpleQueue[ClaimedJob | None] = queue_module.SimpleQueue()  # → handlers
        self.outcomes: queue_module.SimpleQueue[Outcome | None] = queue_module.SimpleQueue()  # → completer
        self.wake = threading.Event()  # the dispatcher: claim now
        self.heartbeat_now = threading.Event()  # set on a cancel notice, and to stop the heartbeat
        self.stopping = threading.Event()  # stop claiming
        self.draining = threading.Event()  # handler threads hand back jobs they have not started
        self.finished = threading.Event()  # the completer may exit once outcomes are written

        self.idle_until: dict[str, float] = {q: 0.0 for q in consumers}  # per queue: claim again after
        self.failing_queues: set[str] = set()
        # Flow control: the limits of this worker's limited queues (the dispatcher re-reads them), how many
        # completions of limited queues' jobs were written (the completer counts), and each per-key queue's
        # typical handler run time (outboxq.queue.limits.typical_job_seconds).
        self.limits: dict[str, flow_limits.QueueLimits] = {}
        self.slots_freed = 0
        self.job_seconds: dict[str, float] = {}

        self.async_loop: AsyncLoop | None = None
        self.metrics = WorkerMetrics()
        self.rooms = Rooms()
        self.metrics.registry.register(self.rooms)
        # Jobs by what became of them; and the claim statements the dispatcher ran (empty ones too) and the
        # completer's writes, whose sizes say how a drain went (jobs per round trip).
        self.stats = {"claimed": 0, "completed": 0, "failed": 0, "fenced": 0, "cancelled": 0,
                      "claims": 0, "writes": 0}
        self._local = threading.local()

    def connect(self, *, autocommit: bool = False) -> DictConnection:
        """A new connection of the worker's (dict rows)."""
        return with_fast_json(psycopg.connect(self.url, autocommit=autocommit, row_factory=dict_row))

    def connect_for_claims(self) -> DictConnection:
        """The dispatcher's connection: autocommit, its commits not waiting for the disk (see
        sql.claims_session_async); the dispatcher makes durable what must be (claims.durable_transaction).
        Its claims are planned once (sql.session_generic_plans)."""
        return self._connect_with(sql.claims_session_async, sql.session_generic_plans)

    def connect_for_completions(self) -> DictConnection:
        """The completer's connection: autocommit (a write that is one statement is one round trip; the others
        are one transaction, Completer.write), its statements planned once per connection
        (sql.session_generic_plans)."""
        return self._connect_with(sql.session_generic_plans)

    def _connect_with(self, *session: str) -> DictConnection:
        """A new autocommit connection with these session settings applied (closed again if they fail)."""
        conn = self.connect(autocommit=True)
        # Prepared at their first run rather than their sixth (psycopg's default): each statement is planned
        # once per connection (its generic plan, session_generic_plans) instead of six times, and the first
        # writes of a worker do not each plan a claim-and-complete statement, which costs milliseconds.
        conn.prepare_threshold = 0
        try:
            for statement in session:
                conn.execute(statement)
        except BaseException:
            conn.close()
            raise
        return conn

    def thread_connection(self) -> DictConnection:
        """A connection owned by the calling handler thread (for ctx.transaction())."""
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
            self._local.conn = conn
        return conn

    def held(self) -> int:
        """Jobs this worker holds the lease of (claimed and not yet written back)."""
        with self.lock:
            return len(self.in_flight)

    def hand_back(self, conn: DictConnection, jobs: list[ClaimedJob]) -> None:
        """Hand back claimed jobs that no handler started: back to the queue, their attempt undone (fenced by
        their lease tokens); they are this worker's no more, even when the write fails (their leases expire, and
        the rescue takes them back)."""
        try:
            if jobs:
                conn.execute(sql.job_release_unstarted, {"ids": [j.id for j in jobs],
                                                         "lease_tokens": [j.lease_token for j in jobs]})
                if not conn.autocommit:
                    conn.commit()
        finally:
            self.forget(jobs)

    def forget(self, jobs: list[ClaimedJob]) -> None:
        """These jobs are this worker's no more (handed back, or left to the rescue)."""
        with self.lock:
            for job in jobs:
                self.in_flight.pop(job.id, None)

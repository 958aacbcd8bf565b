"""The worker: wake (NOTIFY or poll) → claim a batch (SKIP LOCKED, lease token) → run handlers → complete, fenced.

Its rooms, each a module with the state it owns, each on its own thread with its own connection (what they
share is in workers/state.py):
- the dispatcher (workers/dispatcher.py) claims batches per queue while there is room, within the queues'
  limits, and sleeps until notified or a poll is due;
- `concurrency` handler threads (workers/handler_threads.py) run the handlers (workers/executor.py; async
  handlers run on one shared event loop);
- the completer (workers/completer.py) writes outcomes in batches: one statement completes every finished job;
- the heartbeat (workers/heartbeat.py) renews leases, logs stuck handlers' stacks and gives up on timed-out or
  cancelled attempts, and does nothing else: no other work can hold a lease renewal back;
- maintenance (workers/maintenance/) runs rescue, promote and prune while this worker leads maintenance (one
  worker at a time, chosen by an advisory lock);
- the scheduler (workers/scheduler.py) enqueues the slots of the periodic schedules this worker defines;
- the listener (workers/listener.py) LISTENs for new-work and cancel notifications.

Every room's loop runs under the guard of the worker's Rooms (workers/rooms.py): an error it can recover from is
logged with its traceback and the loop runs again after a short pause; a fatal one (a MemoryError, a room failing
again and again) marks the room dead in health() and the worker's metrics and stops the worker: run() then
raises WorkerFailed, and `outboxq worker` exits 1 for its supervisor to start a new process.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from outboxq.db import DictConnection, database_url, url_in_schema
from outboxq.errors import WorkerFailed
from outboxq.queue import limits as flow_limits
from outboxq.queue.names import CANCEL_NOTICE
from outboxq.registry import Registry, default_registry
from outboxq.settings import Settings, get_settings
from outboxq.workers.claims import PLAIN, ClaimStrategy
from outboxq.workers.completer import Completer
from outboxq.workers.dispatcher import Dispatcher
from outboxq.workers.executor import AsyncLoop, ClaimedJob, Outcome
from outboxq.workers.handler_threads import HandlerThreads
from outboxq.workers.heartbeat import Heartbeat
from outboxq.workers.listener import Listener
from outboxq.workers.maintenance.leader import Maintenance
from outboxq.workers.periodic import Schedule
from outboxq.workers.registry import Consumer
from outboxq.workers.scheduler import Scheduler
from outboxq.workers.state import WorkerState

log = logging.getLogger("outboxq.worker")


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
        registry: Registry | None = None,
    ):
        settings = settings or get_settings()
        # The consumers and schedules given, else those of the registry (the default one, which @consumer and
        # periodic() fill); rescue follows the registry's consumers' retry policies.
        self.registry = registry or default_registry
        by_queue = {c.queue: c for c in (consumers if consumers is not None else self.registry.consumers())}
        if not by_queue:
            raise ValueError("a worker needs at least one consumer (@consumer) to run")
        self.state = WorkerState(
            # An explicit url still follows OUTBOXQ_SCHEMA: the worker's connections find outboxq's tables there.
            url=url_in_schema(url, settings.db_schema) if url else database_url(settings),
            settings=settings,
            consumers=by_queue,
            worker_id=worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
            concurrency=concurrency or settings.concurrency,
            batch_size=batch_size or settings.batch_size,
            poll_interval=poll_interval if poll_interval is not None else settings.poll_interval,
        )
        self.run_maintenance = run_maintenance
        self.listen = listen
        self.metrics_port = metrics_port
        # Periodic schedules: those given, else the registry's for the queues this worker serves (a module's
        # schedule is enqueued by the workers that run its queue's consumer).
        self.schedules = (list(schedules) if schedules is not None
                          else [s for s in self.registry.schedules() if s.queue in by_queue])
        self.dispatcher = Dispatcher(self.state)
        self.handlers = HandlerThreads(self.state)
        self.completer = Completer(self.state, self.dispatcher)
        self.heartbeat = Heartbeat(self.state, self.handlers.spawn)
        self.scheduler: Scheduler | None = None
        self.maintenance: Maintenance | None = None
        self.listener: Listener | None = None
        self._threads: list[threading.Thread] = []
        self.metrics.track_in_flight(lambda: self.in_flight)
        # A room that failed beyond recovery stops the worker; run() then says so (WorkerFailed).
        self.state.rooms.on_fatal = self.request_stop

    # What callers and tests read of the worker: its configuration, counters and metrics live in its state.
    settings = property(lambda self: self.state.settings)
    url = property(lambda self: self.state.url)
    consumers = property(lambda self: self.state.consumers)
    worker_id = property(lambda self: self.state.worker_id)
    concurrency = property(lambda self: self.state.concurrency)
    batch_size = property(lambda self: self.state.batch_size)
    poll_interval = property(lambda self: self.state.poll_interval)
    stats = property(lambda self: self.state.stats)
    metrics = property(lambda self: self.state.metrics)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Worker:
        """Start every thread and return at once."""
        s = self.state
        if s.settings.worker_switch_interval_s > 0:
            # The claim and completion threads wait on the database; with the interpreter's default 5 ms
            # switch interval each of their wake-ups can wait that long for the GIL behind busy handler
            # threads, and the whole pipeline slows down.
            sys.setswitchinterval(s.settings.worker_switch_interval_s)
        if any(c.is_async for c in s.consumers.values()):
            s.async_loop = AsyncLoop()
        # The dispatcher first: its connection and first claim are the path to the first job's start; spawned
        # after the other rooms it started connecting later, and so did the first job (the claimed jobs wait in
        # `work` for the handler threads).
        self._spawn(self.dispatcher.loop, "dispatcher")
        for _ in range(s.concurrency):
            self.handlers.spawn()
        # (A guarded completer that fails loses the outcomes its loop had taken and not yet written: their jobs
        # are rescued when their leases expire.)
        self._spawn(self.completer.loop, "completer")
        self._spawn(self.heartbeat.loop, "heartbeat")
        if self.metrics_port is not None:
            s.metrics.serve(self.metrics_port)
        if self.run_maintenance:
            self.maintenance = Maintenance(s.url, s.settings, poll_interval=s.poll_interval,
                                           worker_id=s.worker_id, registry=self.registry, rooms=s.rooms).start()
        if self.listen:
            self.listener = Listener(s.url, self._on_notify, rooms=s.rooms)
            self.listener.start()
        if self.schedules:
            self.scheduler = Scheduler(s.url, self.schedules, rooms=s.rooms).start()
        log.info("worker %s started: queues %s, concurrency %d, batch %d",
                 s.worker_id, ", ".join(s.consumers), s.concurrency, s.batch_size)
        return self

    def request_stop(self) -> None:
        """Stop claiming new jobs (safe to call from a signal handler)."""
        self.state.stopping.set()
        self.state.wake.set()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop claiming, hand back jobs not started, let running handlers finish (bounded), then exit.

        Returns True when every running job finished within the timeout.
        """
        s = self.state
        timeout = s.settings.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.request_stop()
        if self.scheduler:
            self.scheduler.stop()
        s.draining.set()
        clean = self.handlers.drain(timeout)
        if not clean:
            log.warning("shutdown timeout: handlers still running; their leases will expire and be rescued")
        self.handlers.release_unstarted()
        s.finished.set()
        s.heartbeat_now.set()
        s.outcomes.put(None)
        for t in self._threads:
            t.join(timeout=max(1.0, deadline - time.monotonic()))
        if self.listener:
            self.listener.stop()
        if self.maintenance:
            self.maintenance.stop()
        if s.async_loop:
            s.async_loop.close()
        log.info("worker %s stopped: %s", s.worker_id, s.stats)
        return clean

    def run(self) -> None:
        """Start and block until request_stop() (for example from SIGTERM), then stop gracefully.

        Raises WorkerFailed when the worker stopped because one of its rooms failed beyond recovery (`outboxq
        worker` then exits 1, and its supervisor starts a new process).
        """
        self.start()
        while not self.state.stopping.wait(0.5):
            pass
        self.stop()
        rooms = self.state.rooms.health()["rooms"]
        failed = {room: h["last_error"] for room, h in rooms.items() if not h["alive"]}
        if failed:
            raise WorkerFailed(f"worker {self.worker_id} stopped: its " + ", ".join(
                f"{room} failed beyond recovery ({error})" for room, error in failed.items()))

    def health(self) -> dict[str, Any]:
        """{"healthy": bool, "rooms": {room: {"alive", "failures", "last_error"}}}: healthy until a room dies
        (outboxq_worker_room_up in the worker's metrics says the same)."""
        return self.state.rooms.health()

    @property
    def in_flight(self) -> int:
        """Jobs this worker holds the lease of (claimed and not yet written back)."""
        return self.state.held()

    def _spawn(self, loop: Callable[[], None], room: str) -> None:
        """Run a room's loop on a thread of its own, under the room's guard (a pause after a failure is cut short
        once the worker has finished: stop() is joining the threads)."""
        thread = threading.Thread(target=self.state.rooms.guard(room, loop, self.state.finished),
                                  name=f"outboxq-{room}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _on_notify(self, queue: str) -> None:
        s = self.state
        if queue == CANCEL_NOTICE:
            s.heartbeat_now.set()  # a running job's cancel was requested: the heartbeat reads which
            return
        if queue == "*":
            for q in s.idle_until:
                s.idle_until[q] = 0.0
        elif queue in s.idle_until:
            s.idle_until[queue] = 0.0
        else:
            return
        s.wake.set()

    # ------------------------------------------------------------------ one step at a time (app/testing.py, tests)

    def connect(self) -> DictConnection:
        """A new connection of the worker's."""
        return self.state.connect()

    def claim(self, conn: DictConnection, consumer: Consumer, limit: int,
              strategy: ClaimStrategy = PLAIN, params: dict[str, Any] | None = None) -> list[ClaimedJob]:
        """Claim up to `limit` jobs of the consumer's queue under a fresh lease token (committed): the plain
        claim, or the strategy given (claims.BY_ID with {"id": ...}: that job)."""
        return self.dispatcher.claim(conn, consumer, limit, strategy, params)

    def claim_limited(self, conn: DictConnection, consumer: Consumer, limits: flow_limits.QueueLimits,
                      limit: int) -> list[ClaimedJob]:
        """Claim up to `limit` jobs of a limited queue, within its limits (committed)."""
        return self.dispatcher.claim_limited(conn, consumer, limits, limit)

    def write_outcomes(self, conn: DictConnection, outcomes: list[Outcome]) -> None:
        """Write every outcome in one transaction (the completer's write)."""
        self.completer.write(conn, outcomes)

"""The heartbeat: renews the leases of running jobs, logs stuck handlers' stacks, and gives up on attempts past
their timeout or cancelled while running; every few seconds it also announces the worker in the live workers'
registry (one small upsert). It has its own thread and connection and does nothing else, so no other work (a
claim, a completion, maintenance) can hold a lease renewal back."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import socket
import time
from collections import defaultdict
from collections.abc import Callable

import psycopg

from outboxq.db import DictConnection
from outboxq.queue import sql
from outboxq.workers import executor
from outboxq.workers.executor import ClaimedJob, Outcome
from outboxq.workers.state import WorkerState

log = logging.getLogger("outboxq.worker")

VERSION = importlib.metadata.version("outboxq")


def announce(conn: DictConnection, s: WorkerState) -> None:
    """Write (or refresh) this worker's row of the live workers' registry: its queues, limits, jobs in flight."""
    queues = [{"queue": c.queue, "global_concurrency": c.global_concurrency, "rate_limit": c.rate_limit,
               "per_key": c.limit_by is not None} for c in s.consumers.values()]
    host, pid = socket.gethostname(), os.getpid()
    conn.execute(sql.worker_announce, {"id": s.worker_id, "host": host, "pid": pid, "version": VERSION,
                                       "queues": json.dumps(queues), "concurrency": s.concurrency,
                                       "in_flight": s.held()})
    conn.commit()


def _forget(conn: DictConnection, s: WorkerState) -> None:
    """A worker that stops leaves the registry at once (one that is killed lapses)."""
    try:
        conn.execute(sql.worker_forget, {"id": s.worker_id})
        conn.commit()
    except psycopg.Error as exc:
        log.warning("could not leave the workers' registry (%s); the entry lapses", exc)


class Heartbeat:
    """Keeps this worker's leases (its own thread and connection)."""

    def __init__(self, state: WorkerState, spawn_handler: Callable[[], None]):
        self.state = state
        self.spawn_handler = spawn_handler  # a new handler thread, in place of one stuck in an abandoned job

    def loop(self) -> None:
        """Renew leases and watch handlers until the worker has finished."""
        s = self.state
        conn: DictConnection | None = None
        min_lease = min(c.effective_lease_s(s.settings) for c in s.consumers.values())
        heartbeat_every = max(0.05, min_lease / 3)
        tick = max(0.05, min(0.5, heartbeat_every))
        last_heartbeat = last_announced = 0.0
        while not s.finished.is_set():
            now = time.monotonic()
            try:
                if conn is None or conn.closed:
                    conn = s.connect()
                if now - last_heartbeat >= heartbeat_every:
                    self.renew(conn)
                    last_heartbeat = now
                # six announcements within the lapse after which the worker counts as gone (settings.worker_lapse_s)
                if now - last_announced >= s.settings.worker_lapse_s / 6:
                    announce(conn, s)
                    last_announced = now
                self._check_stuck(now)
            except psycopg.Error as exc:
                log.warning("heartbeat: database error (%s); reconnecting", exc)
                if conn is not None:
                    conn.close()
                conn = None
            except BaseException:
                if conn is not None:  # (the room's guard runs the loop again, on a new connection)
                    conn.close()
                raise
            if s.heartbeat_now.wait(tick):
                s.heartbeat_now.clear()
                last_heartbeat = 0.0
        if conn is not None:
            _forget(conn, s)
            conn.close()

    def renew(self, conn: DictConnection) -> None:
        """Renew the leases of running jobs; flag the jobs whose lease was taken away, abandon cancelled ones."""
        s = self.state
        with s.lock:
            running = [j for j in s.in_flight.values() if not j.finished]
        if not running:
            return
        by_lease: dict[float, list[ClaimedJob]] = defaultdict(list)
        for job in running:
            by_lease[job.consumer.effective_lease_s(s.settings)].append(job)
        alive: dict[int, bool] = {}
        for lease_s, jobs in by_lease.items():
            rows = conn.execute(sql.job_heartbeat, {
                "ids": [j.id for j in jobs], "lease_tokens": [j.lease_token for j in jobs], "lease_s": lease_s,
            }).fetchall()
            alive.update({r["id"]: r["cancel_requested"] for r in rows})
        conn.commit()
        with s.lock:
            still_held = set(s.in_flight)
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
        s = self.state
        with s.lock:
            started = [j for j in s.in_flight.values() if j.started_monotonic is not None and not j.finished]
            started += s.abandoned.values()
        for job in started:
            executor.report_stuck(job, now)
            timeout = job.consumer.effective_timeout_s(s.settings)
            if timeout is not None and not job.abandoned and now - job.started_monotonic > timeout:  # type: ignore[operator]
                self._abandon(job, Outcome(job=job, succeeded=False, error=f"timed out after {timeout:g} s "
                                           "(the consumer's timeout)", duration_s=now - job.started_monotonic))  # type: ignore[operator]

    def _abandon(self, job: ClaimedJob, outcome: Outcome) -> None:
        """Stop waiting for a running handler: write `outcome` (failed or cancelled; the write revokes the
        lease, so the handler's later ctx.transaction() is refused), cancel an async handler's task, and give
        a sync handler's slot to a new thread (Python cannot stop the old one; it ends when the handler
        returns)."""
        s = self.state
        with s.lock:
            if job.finished or job.abandoned:
                return
            job.abandoned = True
            if not job.consumer.is_async:
                s.abandoned[job.id] = job
        assert job.ctx is not None
        job.ctx.request_cancel()
        if job.task is not None and s.async_loop is not None:
            s.async_loop.loop.call_soon_threadsafe(job.task.cancel)
        s.outcomes.put(outcome)
        if not job.consumer.is_async:
            self.spawn_handler()
        job.ctx.log.warning("job %s: %s; %s", job.id, outcome.error,
                            "its task was cancelled" if job.consumer.is_async else
                            "its lease is revoked and its handler slot given to a new thread")

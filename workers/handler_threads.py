"""The handler threads: each takes claimed jobs from the dispatcher, runs them (outboxq.workers.executor) and
passes the outcome to the completer; a stopping worker hands back the jobs no handler started."""

from __future__ import annotations

import itertools
import logging
import queue as queue_module
import threading
import time

import psycopg

from outboxq.workers import executor
from outboxq.workers.executor import ClaimedJob
from outboxq.workers.state import WorkerState

log = logging.getLogger("outboxq.worker")

THREAD_PREFIX = "outboxq-handler"


class HandlerThreads:
    """`concurrency` threads running handlers (async handlers run on the worker's one event loop)."""

    def __init__(self, state: WorkerState):
        self.state = state
        self.threads: list[threading.Thread] = []
        self._names = itertools.count()
        self._unstarted: list[ClaimedJob] = []

    def spawn(self) -> None:
        """Start one more handler thread (at start, and in place of one left in an abandoned sync handler)."""
        # (Under the room's guard: an error of the loop itself, not of a handler, which the executor turns into
        # the job's outcome, is logged and the thread goes on taking jobs.)
        loop = self.state.rooms.guard("handler", self._loop, self.state.draining)
        thread = threading.Thread(target=loop, name=f"{THREAD_PREFIX}-{next(self._names)}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def _loop(self) -> None:
        s = self.state
        while True:
            job = s.work.get()
            if job is None:
                return
            with s.lock:
                s.buffered -= 1
                refill = s.buffered == s.refill_below - 1
            if refill:  # the handlers may run dry: the dispatcher claims now, not after the next completion
                s.wake.set()
            if s.draining.is_set():
                with s.lock:
                    self._unstarted.append(job)
                continue
            s.metrics.job_started(job)
            outcome = executor.execute(job, s.async_loop)
            with s.lock:
                abandoned = job.abandoned
                job.finished = True  # no more heartbeats or stack dumps for it
                s.abandoned.pop(job.id, None)
            if not abandoned:
                s.outcomes.put(outcome)
            elif not job.consumer.is_async:
                return  # a new handler thread took this one's place when the job was abandoned

    def drain(self, deadline_s: float) -> bool:
        """Let the running handlers finish within `deadline_s` seconds (the threads exit); True if all did."""
        deadline = time.monotonic() + deadline_s
        for _ in range(len(self.threads)):
            self.state.work.put(None)
        for t in list(self.threads):
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def release_unstarted(self) -> None:
        """Hand back the claimed jobs no handler started: back to the queue, their attempt undone."""
        s = self.state
        while True:  # jobs still in the work queue were never started either
            try:
                job = s.work.get_nowait()
            except queue_module.Empty:
                break
            if job is not None:
                self._unstarted.append(job)
        if not self._unstarted:
            return
        try:
            with s.connect() as conn:
                s.hand_back(conn, self._unstarted)
            log.info("handed back %d claimed jobs that had not started", len(self._unstarted))
        except psycopg.Error as exc:
            log.warning("could not hand back %d unstarted jobs (%s): they will be rescued when their "
                        "leases expire", len(self._unstarted), exc)
            s.forget(self._unstarted)
        self._unstarted.clear()

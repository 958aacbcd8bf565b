"""Deterministic helpers for users' own tests: run jobs in the calling thread. No threads, no sleeping."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from outboxq.db import database_url, url_in_schema
from outboxq.errors import InvalidTransition, JobFailed, JobNotFound
from outboxq.queue import sql
from outboxq.settings import get_settings
from outboxq.workers import claims, executor
from outboxq.workers.executor import Outcome
from outboxq.workers.registry import Consumer, get_consumer


class TestQueue:
    """Runs jobs of registered consumers synchronously against a real database."""

    __test__ = False  # not a pytest test class

    def __init__(self, url: str | None = None):
        from outboxq.workers.runner import Worker

        self.url = url_in_schema(url, get_settings().db_schema) if url else database_url()
        self._worker_cls = Worker

    def _worker(self, consumer: Consumer) -> Any:
        return self._worker_cls([consumer], url=self.url, listen=False, run_maintenance=False)

    def _consumer(self, queue: str) -> Consumer:
        consumer = get_consumer(queue)
        if consumer is None:
            raise LookupError(f"no @consumer registered for queue {queue!r}")
        return consumer

    def _run(self, queue: str, *, job_id: int | None = None, expect_success: bool = True) -> Outcome | None:
        consumer = self._consumer(queue)
        worker = self._worker(consumer)
        with psycopg.connect(self.url, row_factory=dict_row) as conn:
            if job_id is None:
                jobs = worker.claim(conn, consumer, 1)
            else:
                jobs = worker.claim(conn, consumer, 1, claims.BY_ID, {"id": job_id})
            if not jobs:
                return None
            outcome = executor.execute(jobs[0], None)
            worker.write_outcomes(conn, [outcome])
        if expect_success and not outcome.succeeded:
            raise JobFailed(f"job {outcome.job.id} of {queue!r} failed: {outcome.error}\n{outcome.traceback or ''}")
        return outcome

    def run_one(self, queue: str) -> Any:
        """Claim the next ready job of `queue`, run its handler here, write the outcome; assert it succeeded.

        Returns the handler's return value. Raises LookupError when no job is ready.
        """
        outcome = self._run(queue)
        if outcome is None:
            raise LookupError(f"no ready job in queue {queue!r}")
        return outcome.result

    def run_job(self, queue: str, job_id: int, *, expect_success: bool = True) -> Outcome:
        """Run one given ready job (queued or retrying) of `queue` now, whatever its run_at."""
        outcome = self._run(queue, job_id=job_id, expect_success=expect_success)
        if outcome is None:
            raise InvalidTransition(f"job {job_id} of {queue!r} is not queued or retrying")
        return outcome

    def rerun(self, queue: str, job_id: int) -> Any:
        """Run a job that is already done a second time (to test that its handler is idempotent)."""
        with psycopg.connect(self.url) as conn:
            if conn.execute(sql.job_requeue_done, {"id": job_id}).fetchone() is None:
                if conn.execute(sql.job_get, {"id": job_id}).fetchone() is None:
                    raise JobNotFound(job_id)
                raise InvalidTransition(f"job {job_id} is not done; rerun only re-runs finished jobs")
        return self.run_job(queue, job_id).result

    def drain(self, queue: str, *, expect_success: bool = True, limit: int = 100_000) -> int:
        """Run ready jobs of `queue` one by one until none is ready; returns how many ran."""
        ran = 0
        while ran < limit and self._run(queue, expect_success=expect_success) is not None:
            ran += 1
        return ran

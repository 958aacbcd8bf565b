"""JobContext: what a handler knows about the job it runs, and ctx.transaction() for exactly-once effects."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outboxq.errors import InvalidInput, LeaseLost
from outboxq.queue import sql, storable
from outboxq.settings import get_settings

log = logging.getLogger("outboxq.worker")

MAX_PROGRESS_MESSAGE = 1000


def delivery_hash(consumer_id: str, job_id: int) -> str:
    """A stable hash of (consumer id, job id): the same on every attempt of the job."""
    return hashlib.sha256(f"{consumer_id}\x00{job_id}".encode()).hexdigest()


@dataclass(eq=False, kw_only=True)
class JobContext:
    """Passed to each handler as `ctx`: the job's identity, its attempt, cancellation, and ctx.transaction()."""

    job_id: int
    queue: str
    key: str | None
    attempt: int
    max_attempts: int | None
    lease_token: uuid.UUID
    consumer_id: str
    captured_context: dict[str, Any] = field(default_factory=dict)
    connection_factory: Callable[[], psycopg.Connection[Any]] | None = None
    # A plain flag, not an Event: set by the worker's heartbeat thread, read by the handler; nothing waits
    # on it, and a job context is made for every job on the hot path.
    _cancelled: bool = field(default=False, init=False)
    fenced: bool = field(default=False, init=False)
    completed_in_transaction: bool = field(default=False, init=False)
    _in_transaction: bool = field(default=False, init=False)
    _result_json: str | None = field(default=None, init=False)

    @cached_property
    def log(self) -> logging.LoggerAdapter:
        """A logger whose every line carries the job's queue, id, attempt and captured context."""
        return logging.LoggerAdapter(
            log,
            {"queue": self.queue, "job_id": self.job_id, "attempt": self.attempt,
             "job_context": self.captured_context},
        )

    @cached_property
    def _workflow_place(self) -> dict[str, Any]:
        """The step's workflow, name and parents' results: read once, when the handler first asks."""
        if self.connection_factory is None:
            raise RuntimeError("ctx.workflow_id, ctx.step and ctx.parent_results need a worker (or outboxq.testing) "
                               "to provide connections")
        with self.connection_factory().cursor(row_factory=dict_row) as cur:
            row = cur.execute(sql.job_workflow_place, {"id": self.job_id}).fetchone()
        return row or {"workflow_id": None, "step": None, "parent_results": {}}

    @property
    def workflow_id(self) -> int | None:
        """The workflow this job is a step of (outboxq.Workflow), or None."""
        return self._workflow_place["workflow_id"]

    @property
    def step(self) -> str | None:
        """This step's name within its workflow, or None."""
        return self._workflow_place["step"]

    @property
    def parent_results(self) -> dict[str, Any]:
        """The results of the steps this step comes after, by step name (a step that failed under a "run" edge:
        None). Empty for a job that is no workflow's step."""
        return self._workflow_place["parent_results"]

    @property
    def delivery_hash(self) -> str:
        """Stable across attempts: use it to make side effects elsewhere idempotent."""
        return delivery_hash(self.consumer_id, self.job_id)

    @property
    def cancelled(self) -> bool:
        """True once an operator asked this running job to stop (or its lease was lost)."""
        return self._cancelled

    def request_cancel(self) -> None:
        """Set by the worker when the job's cancel was requested or its lease was lost."""
        self._cancelled = True

    def set_progress(self, fraction: float, message: str | None = None) -> None:
        """Record how far the job has come (0.0 to 1.0, and an optional short message): visible in get_job,
        the API and the dashboard while it runs. Each call is one small write, fenced by the job's lease."""
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 <= fraction <= 1.0:
            raise InvalidInput(f"progress must be a number from 0.0 to 1.0, not {fraction!r}")
        if message is not None and (not isinstance(message, str) or len(message) > MAX_PROGRESS_MESSAGE):
            raise InvalidInput(f"the progress message must be a string of at most {MAX_PROGRESS_MESSAGE} "
                               "characters")
        # (a message only describes: what PostgreSQL cannot hold is escaped rather than refused)
        message = storable.diagnostic_text(message, 4 * MAX_PROGRESS_MESSAGE)
        if self.connection_factory is None:
            raise RuntimeError("ctx.set_progress() needs a worker (or outboxq.testing) to provide connections")
        conn = self.connection_factory()
        row = conn.execute(sql.job_set_progress, {"id": self.job_id, "lease_token": self.lease_token,
                                                  "progress": float(fraction), "message": message}).fetchone()
        if row is None:
            self.fenced = True
            raise LeaseLost(f"job {self.job_id}: this worker no longer holds its lease; progress not recorded")

    def set_result(self, value: Any) -> None:
        """Inside `with ctx.transaction():`, the job's result, stored in the same commit as the block's effects
        (a value the handler returns after the block is stored only after that commit, and is lost should the
        worker die between: a workflow's later steps would then see None in ctx.parent_results). InvalidInput
        for a value PostgreSQL cannot store or over max_result_bytes; RuntimeError outside the block."""
        if not self._in_transaction:
            raise RuntimeError("ctx.set_result() belongs inside `with ctx.transaction():`; elsewhere, return the "
                               "result")
        try:
            self._result_json = storable.result_json(value, get_settings().max_result_bytes)
        except storable.NotStorable as exc:
            raise InvalidInput(f"result not storable: {exc}") from None

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction in which the handler's writes and the job's completion commit together.

        The job's row is locked first, and only if this worker still holds the lease; otherwise LeaseLost
        is raised and nothing is written. On a normal exit the job is completed in the same transaction, so
        the effect happens exactly once even if the worker dies at any point.
        """
        if self.connection_factory is None:
            raise RuntimeError("ctx.transaction() needs a worker (or outboxq.testing) to provide connections")
        conn = self.connection_factory()
        try:
            with conn.transaction():
                row = conn.execute(
                    sql.job_lock_if_leased, {"id": self.job_id, "lease_token": self.lease_token}
                ).fetchone()
                if row is None:
                    self.fenced = True
                    raise LeaseLost(
                        f"job {self.job_id}: this worker no longer holds its lease; its effects were not written"
                    )
                self._in_transaction = True
                try:
                    yield conn
                finally:
                    self._in_transaction = False
                done = conn.execute(*self._completion()).fetchall()
                if not any(_first(r) == self.job_id for r in done):
                    raise LeaseLost(f"job {self.job_id}: completion refused (lease lost)")
        except psycopg.OperationalError:
            conn.close()  # a broken connection is replaced on next use
            raise
        self.completed_in_transaction = True


    def _completion(self) -> tuple[str, dict[str, Any]]:
        """ctx.transaction()'s completing statement: with the result given by set_result(), or without."""
        params: dict[str, Any] = {"ids": [self.job_id], "lease_token": self.lease_token}
        if self._result_json is None:
            return sql.job_complete_in_lease, params
        return sql.job_complete_in_lease_with_result, {**params, "result": self._result_json}


def _first(row: Any) -> Any:
    if isinstance(row, dict):
        return next(iter(row.values()))
    return row[0]

"""Run one claimed job's handler (sync or async) and say what happened; dump the stack of a stuck handler."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from outboxq import tracing
from outboxq.db import array_literal
from outboxq.errors import LeaseLost, Snooze
from outboxq.queue import context as job_context
from outboxq.queue import storable
from outboxq.queue.storable import safe_str
from outboxq.workers.context import JobContext
from outboxq.workers.registry import Consumer

log = logging.getLogger("outboxq.worker")


@dataclass(slots=True)
class ClaimedJob:
    """A job this worker holds the lease of."""

    id: int
    queue: str
    key: str | None
    payload: Any
    attempts: int
    max_attempts: int | None
    lease_token: Any
    context: dict[str, Any] | None
    consumer: Consumer
    ctx: JobContext | None = None
    started_monotonic: float | None = None
    thread_id: int | None = None
    task: asyncio.Task | None = None
    stack_dumps: int = 0  # how many max_execute_s thresholds have been reported
    finished: bool = False  # the handler returned; its outcome is on the way to the database
    # The worker gave up on the attempt (timeout, or cancelled while running): its outcome was written for
    # it, and whatever the handler still returns is dropped.
    abandoned: bool = False


@dataclass(slots=True)
class Outcome:
    """What a handler run came to: succeeded (with its result as JSON text, if any), failed (with error),
    snoozed, cancelled, or fenced."""

    job: ClaimedJob
    succeeded: bool
    error: str | None = None
    traceback: str | None = None
    cancelled: bool = False
    fenced: bool = False
    completed_in_transaction: bool = False
    duration_s: float = 0.0
    result: Any = field(default=None)
    result_json: str | None = None  # the return value as JSON, stored with the job; None when it returned None
    snooze_s: float | None = None  # raised Snooze(seconds): run again then, the attempt given back

    @property
    def label(self) -> str:
        """succeeded, failed, timed_out, snoozed, cancelled or fenced: what the handler run came to."""
        if self.fenced:
            return "fenced"
        if self.snooze_s is not None:
            return "snoozed"
        if self.cancelled:
            return "cancelled"
        if self.succeeded:
            return "succeeded"
        if self.error and "timed out" in self.error:
            return "timed_out"
        return "failed"


def completion_params(succeeded: list[Outcome]) -> dict[str, str]:
    """The ids and lease tokens of jobs to complete, as the completion statements take them (array literals)."""
    # A claim's jobs share its token object: a few per batch, each made text once (keyed by identity, since a
    # UUID's hash is computed in Python).
    tokens = {id(o.job.lease_token): o.job.lease_token for o in succeeded}
    texts = {key: str(token) for key, token in tokens.items()}
    return {"ids": array_literal(o.job.id for o in succeeded),
            "lease_tokens": array_literal(texts[id(o.job.lease_token)] for o in succeeded)}


def is_unique_violation(exc: BaseException) -> bool:
    """True for a unique-violation raised by psycopg, directly or wrapped by SQLAlchemy."""
    import psycopg.errors

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, psycopg.errors.UniqueViolation):
            return True
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False


class AsyncLoop:
    """One event loop in its own thread, where every async handler of a worker runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="outboxq-async", daemon=True)
        self.thread.start()

    def run(self, job: ClaimedJob, coroutine_factory: Any) -> Any:
        """Run the coroutine on the loop and wait for it, remembering its task for stack dumps."""

        async def tracked() -> Any:
            job.task = asyncio.current_task()
            # The task runs in the loop thread's context: restore the job's captured variables in it too.
            with job_context.restored(job.context):
                return await coroutine_factory()

        return asyncio.run_coroutine_threadsafe(tracked(), self.loop).result()

    def close(self) -> None:
        """Stop the loop thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def execute(job: ClaimedJob, async_loop: AsyncLoop | None) -> Outcome:
    """Run the job's handler in the calling thread and classify the result (in a span when tracing)."""
    if not tracing.enabled():
        return _execute(job, async_loop)
    with tracing.consumer_span(job.queue, job.id, job.attempts, job.context) as span:
        outcome = _execute(job, async_loop)
        tracing.set_outcome(span, outcome.label, outcome.error)
    return outcome


def _execute(job: ClaimedJob, async_loop: AsyncLoop | None) -> Outcome:
    consumer = job.consumer
    ctx = job.ctx
    assert ctx is not None
    job.thread_id = threading.get_ident()
    job.started_monotonic = time.monotonic()
    payload = job.payload
    try:
        if consumer.decode is not None and isinstance(payload, bytes | bytearray | memoryview):
            payload = consumer.decode(bytes(payload))
        args = (payload, ctx) if consumer.takes_context else (payload,)
        with job_context.restored(job.context):
            if consumer.is_async:
                if async_loop is None:
                    result = asyncio.run(consumer.handler(*args))
                else:
                    result = async_loop.run(job, lambda: consumer.handler(*args))
            else:
                result = consumer.handler(*args)
    except LeaseLost as exc:
        ctx.log.warning("job %s fenced: %s", job.id, safe_str(exc))
        return _outcome(job, False, error=safe_str(exc), fenced=True)
    except Snooze as snooze:
        outcome = _outcome(job, False, error=safe_str(snooze))
        outcome.snooze_s = snooze.seconds
        return outcome
    except SystemExit as exc:  # (sys.exit() in a handler fails its job; it does not end the worker's thread)
        return _outcome(job, False, error=f"SystemExit: the handler called exit({safe_str(exc.code)})",
                        tb=_traceback())
    except Exception as exc:
        if consumer.idempotent_conflicts and is_unique_violation(exc):
            ctx.log.info("job %s: unique violation treated as success (idempotent_conflicts)", job.id)
            return _outcome(job, True)
        if ctx.cancelled and not ctx.fenced:
            return _outcome(job, False, error=f"cancelled: {type(exc).__name__}: {safe_str(exc)}", cancelled=True)
        return _outcome(job, False, error=f"{type(exc).__name__}: {safe_str(exc)}", tb=_traceback())
    if ctx.cancelled and not ctx.completed_in_transaction and not ctx.fenced:
        return _outcome(job, False, error="cancelled while running", cancelled=True, result=result)
    outcome = _outcome(job, True, result=result)
    if result is not None:
        # Checked here, in the handler's thread: a result PostgreSQL would refuse fails this attempt alone
        # (its size bound is the completer's, which knows the settings).
        try:
            outcome.result_json = storable.result_json(result)
        except storable.NotStorable as exc:
            if outcome.completed_in_transaction:  # (its effects and completion are committed: keep them)
                ctx.log.error("job %s: result not stored: %s", job.id, exc)
                outcome.result = None
                return outcome
            return _outcome(job, False, error=f"result not storable: {exc}")
    return outcome


def _traceback() -> str:
    """The current exception's traceback; a description when formatting it fails (a hostile __repr__)."""
    try:
        return traceback.format_exc()
    except Exception as exc:  # noqa: BLE001
        return f"(the traceback could not be formatted: {type(exc).__name__})"


def _outcome(job: ClaimedJob, ok: bool, *, error: str | None = None, tb: str | None = None,
             cancelled: bool = False, fenced: bool = False, result: Any = None) -> Outcome:
    ctx = job.ctx
    assert ctx is not None
    return Outcome(
        job=job,
        succeeded=ok,
        error=error,
        traceback=tb,
        cancelled=cancelled,
        fenced=fenced or ctx.fenced,
        completed_in_transaction=ctx.completed_in_transaction,
        duration_s=time.monotonic() - (job.started_monotonic or time.monotonic()),
        result=result,
    )


def handler_stack(job: ClaimedJob) -> str:
    """The current stack of the job's handler: its task's for async handlers, else its thread's."""
    if job.task is not None:
        # A suspended coroutine's frames are not linked by f_back (and Task.get_stack() returns only the
        # outermost one): walk the await chain, outermost first, so the handler's own frames show.
        frames = []
        awaited: Any = job.task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                frames.append(frame)
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        if not frames:
            return "(no frames)"
        summary = traceback.StackSummary.extract((f, f.f_lineno) for f in frames)
        return "".join(summary.format())
    frame = sys._current_frames().get(job.thread_id or -1)
    if frame is None:
        return "(thread has finished)"
    return "".join(traceback.format_stack(frame))


def report_stuck(job: ClaimedJob, now_monotonic: float) -> bool:
    """Log the handler's stack at ERROR once per max_execute_s threshold it crosses; True when it logged."""
    if job.started_monotonic is None:
        return False
    limit = job.consumer.effective_max_execute_s()
    running_for = now_monotonic - job.started_monotonic
    crossed = int(running_for // limit) if limit > 0 else 0
    if crossed <= job.stack_dumps:
        return False
    job.stack_dumps = crossed
    assert job.ctx is not None
    job.ctx.log.error(
        "job %s of queue %s has been running for %.1f s (max_execute_s=%s); its handler's stack:\n%s",
        job.id, job.queue, running_for, limit, handler_stack(job),
    )
    return True

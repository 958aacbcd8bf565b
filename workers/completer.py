"""The completer: writes handlers' outcomes in batches, in one transaction each: one statement completes every
finished job at once, one fails every failed one (each with the fate its retry policy decided), all fenced by
their lease tokens; the slots that completions free in a concurrency-bound queue go to its next jobs in the
completing statement (Dispatcher.complete_handing_over)."""

from __future__ import annotations

import logging
import queue as queue_module
import time
from contextlib import nullcontext
from typing import Any

import psycopg

from outboxq.db import DictConnection, one_row
from outboxq.queue import limits as flow_limits
from outboxq.queue import sql, storable
from outboxq.settings import Settings
from outboxq.workers.dispatcher import Dispatcher, Handover
from outboxq.workers.executor import Outcome, completion_params
from outboxq.workers.state import RECONNECT_DELAY_S, WorkerState

log = logging.getLogger("outboxq.worker")


class Completer:
    """Writes outcomes back (its own thread and connection)."""

    def __init__(self, state: WorkerState, dispatcher: Dispatcher):
        self.state = state
        self.dispatcher = dispatcher  # its claims into the slots that completions free
        # Outcomes taken from the queue and not yet written: kept here, so that a loop run again by its room's
        # guard after an unexpected error writes them rather than losing them to their leases' expiry.
        self.pending: list[Outcome] = []
        self.conn: DictConnection | None = None

    def loop(self) -> None:
        """Write outcomes until the worker has finished and every outcome is written."""
        try:
            self._write_until_finished()
        finally:  # (also when an unexpected error ends the loop: its guard runs it again on a new connection)
            if self.conn is not None:
                self.conn.close()
                self.conn = None

    def _write_until_finished(self) -> None:
        s = self.state
        pending = self.pending
        try:
            # Up front: the first outcomes do not wait for a new session (a connection, then the catalog reads
            # of its first statements).
            self.conn = self._connect()
        except psycopg.Error as exc:
            log.warning("completer: cannot connect and prepare (%s); trying again when an outcome comes", exc)
        give_up_at: float | None = None
        while True:
            try:
                item = s.outcomes.get(timeout=0.2)
            except queue_module.Empty:
                item = None
            if item is not None:
                pending.append(item)
            while True:  # take everything that is ready: one write for all of it
                try:
                    more = s.outcomes.get_nowait()
                except queue_module.Empty:
                    break
                if more is not None:
                    pending.append(more)
            if pending:
                try:
                    if self.conn is None or self.conn.closed:
                        self.conn = self._connect()
                    self.write_isolating(self.conn, pending)  # (empties `pending` as it writes)
                except psycopg.Error as exc:
                    log.warning("completer: database error (%s); retrying", exc)
                    if self.conn is not None:
                        self.conn.close()
                    self.conn = None
                    if s.finished.is_set():
                        # Shutting down with the database away: give up after a while; the leases will
                        # expire and the jobs be rescued.
                        give_up_at = give_up_at or time.monotonic() + 5.0
                        if time.monotonic() > give_up_at:
                            return
                    time.sleep(RECONNECT_DELAY_S)
                    continue
            if s.finished.is_set() and not pending and s.outcomes.empty():
                return

    def _connect(self) -> DictConnection:
        """The completer's connection, its handover statement prepared (Dispatcher.prepare_handovers)."""
        conn = self.state.connect_for_completions()
        try:
            self.dispatcher.prepare_handovers(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def write_isolating(self, conn: DictConnection, pending: list[Outcome]) -> None:
        """Write the outcomes, removing each from `pending` once written. An outcome whose write PostgreSQL (or
        the driver) refuses is isolated by halving the batch, and written instead as a failure of its job alone
        ("outcome not storable: ..."), so one bad value never holds back the others. A lost connection is
        raised, with the outcomes not yet written left in `pending`."""
        try:
            self.write(conn, pending)
        except Exception as exc:
            if _connection_lost(conn, exc):
                raise
            if len(pending) == 1:
                self._write_unstorable(conn, pending[0], exc)
                pending.clear()
            else:
                middle = len(pending) // 2
                first, second = pending[:middle], pending[middle:]
                try:
                    self.write_isolating(conn, first)
                    self.write_isolating(conn, second)
                finally:
                    pending[:] = first + second  # (what neither half wrote yet)
            return
        written = pending[:]
        pending.clear()  # (first: what follows the commit must not make the loop write these again)
        self.state.metrics.jobs_finished(written)

    def _write_unstorable(self, conn: DictConnection, outcome: Outcome, exc: Exception) -> None:
        """Write, as a failed attempt, an outcome whose own write was refused; when even that is refused (a
        fault of ours rather than of the value), leave the job to the rescue of its lease."""
        s = self.state
        reason = storable.diagnostic_text(f"outcome not storable: {type(exc).__name__}: {storable.safe_str(exc)}",
                                          s.settings.max_error_bytes)
        log.error("job %s: its outcome (%s) was refused by the database; failing the attempt: %s",
                  outcome.job.id, outcome.label, reason)
        failure = Outcome(job=outcome.job, succeeded=False, error=reason, duration_s=outcome.duration_s)
        try:
            self.write(conn, [failure])
        except Exception as again:
            if _connection_lost(conn, again):
                raise
            log.exception("job %s: even its failure could not be written; its lease will expire and the job "
                          "be rescued", outcome.job.id)
            with s.lock:
                s.in_flight.pop(outcome.job.id, None)
            return
        s.metrics.jobs_finished([failure])

    def write(self, conn: DictConnection, outcomes: list[Outcome]) -> None:
        """Write every outcome in one transaction: one statement completes all the successes (and, for a queue
        that hands its slots over, claims its next jobs into them). Where that is the only statement, it is the
        whole transaction on the completer's autocommit connection: one round trip."""
        s = self.state
        outcomes = [bounded(o, s.settings) for o in outcomes]
        to_complete = [o for o in outcomes if o.succeeded and not o.completed_in_transaction and not o.fenced]
        with_results = [o for o in outcomes if o.succeeded and not o.fenced and o.result_json is not None
                        and not o.completed_in_transaction]
        to_end = [o for o in outcomes if not o.fenced and not o.succeeded]  # failed, snoozed, cancelled
        # done in ctx.transaction(): their results stored and their dependents released here (sql.jobs.
        # job_complete_in_lease says why)
        done_in_transaction = [o for o in outcomes if o.completed_in_transaction and not o.fenced]
        succeeded_queues = {o.job.queue for o in outcomes if o.succeeded and not o.fenced}
        now_healthy = succeeded_queues & s.failing_queues
        # On the completer's autocommit connection, a transaction only where the write is more than one statement
        # (a caller's connection is in one already: write_outcomes).
        in_transaction = conn.autocommit and bool(with_results or to_end or now_healthy or done_in_transaction)
        completed_ids: set[int] = set()
        handover: Handover | None = None
        with conn.transaction() if in_transaction else nullcontext():
            if with_results:
                conn.execute(sql.job_store_results, {
                    "ids": [o.job.id for o in with_results],
                    "lease_tokens": [o.job.lease_token for o in with_results],
                    "results": [o.result_json for o in with_results],
                })
            if done_in_transaction:
                _settle(conn, done_in_transaction)
            failed_writes = self._end(conn, to_end)
            for queue_name in now_healthy:
                conn.execute(sql.queue_mark_healthy, {"queue": queue_name})
            # Last, right before the commit (a handover's lease margin is checked in its statement), and after
            # the queue is marked healthy (its claim reads that).
            if to_complete:
                handover = self.dispatcher.complete_handing_over(conn, to_complete, outcomes)
                if handover is not None:
                    completed_ids = handover.completed_ids
                else:
                    completed_ids = self._complete(conn, to_complete)
        if not conn.autocommit:  # (a caller's connection: write_outcomes)
            conn.commit()
        s.stats["writes"] += 1
        s.failing_queues -= succeeded_queues
        if handover is not None:  # committed: the jobs claimed into the freed slots are this worker's
            self.dispatcher.hold(handover.jobs)
            for job in handover.jobs:
                s.work.put(job)

        self._count_and_log(outcomes, to_complete, completed_ids, failed_writes)
        _free_slots(s, outcomes, handover)

    def _count_and_log(self, outcomes: list[Outcome], to_complete: list[Outcome], completed_ids: set[int],
                       failed_writes: list[tuple[Outcome, Any]]) -> None:
        """After a write: count each outcome in the worker's stats and log failures, snoozes and fences."""
        s = self.state
        for o in to_complete:
            if o.job.id in completed_ids:
                s.stats["completed"] += 1
            else:
                self._log_fenced(o, "completion")
        for o, row in failed_writes:
            job_log = o.job.ctx.log if o.job.ctx is not None else log
            if row is None:
                self._log_fenced(o, "cancel" if o.cancelled else "failure")
            elif o.cancelled:
                s.stats["cancelled"] += 1
            elif o.snooze_s is not None:
                job_log.info("job %s snoozed for %g s", o.job.id, o.snooze_s)
            else:
                s.stats["failed"] += 1
                job_log.warning("job %s attempt %d failed (%s): now %s", o.job.id, o.job.attempts, o.error,
                                row["status"])
        for o in outcomes:
            if o.fenced:
                self._log_fenced(o, "effects")
            elif o.completed_in_transaction:
                s.stats["completed"] += 1

    def _complete(self, conn: DictConnection, to_complete: list[Outcome]) -> set[int]:
        """Complete these jobs (one statement, each fenced by its lease token); the ids completed."""
        row = one_row(conn.execute(sql.job_complete_batch, completion_params(to_complete)))
        return set(row["completed_ids"] or ())

    def _end(self, conn: DictConnection, to_end: list[Outcome]) -> list[tuple[Outcome, Any]]:
        """Write the outcomes that did not succeed (cancelled, snoozed, failed: each failure with the fate its
        retry policy decided); each with its row, None where the write was fenced."""
        s = self.state
        failed_writes = []
        to_fail: list[Outcome] = []
        for o in to_end:
            if o.cancelled:
                failed_writes.append((o, conn.execute(sql.job_finish_cancelled, {
                    "id": o.job.id, "lease_token": o.job.lease_token}).fetchone()))
            elif o.snooze_s is not None:
                failed_writes.append((o, conn.execute(sql.job_snooze, {
                    "id": o.job.id, "lease_token": o.job.lease_token, "delay": o.snooze_s,
                    "error": o.error}).fetchone()))
            else:
                to_fail.append(o)
        if to_fail:
            decisions = [o.job.consumer.retry_policy(s.settings).decide(o.job.attempts, o.job.max_attempts)
                         for o in to_fail]
            failed_rows = {r["id"]: r for r in conn.execute(sql.job_fail_batch, {
                "ids": [o.job.id for o in to_fail], "lease_tokens": [o.job.lease_token for o in to_fail],
                "statuses": [status for status, _ in decisions], "delays": [delay for _, delay in decisions],
                "errors": [o.error or "failed" for o in to_fail], "tracebacks": [o.traceback for o in to_fail],
                "mark_failing": True,
            }).fetchall()}
            failed_writes += [(o, failed_rows.get(o.job.id)) for o in to_fail]
        return failed_writes

    def _log_fenced(self, outcome: Outcome, what: str) -> None:
        s = self.state
        s.stats["fenced"] += 1
        (outcome.job.ctx.log if outcome.job.ctx is not None else log).warning("job %s: %s refused, this worker was fenced (its lease %s was taken away)",
                    outcome.job.id, what, outcome.job.lease_token)


def _connection_lost(conn: DictConnection, exc: BaseException) -> bool:
    """True when the write failed because the session is gone or in trouble (retry it on a new connection),
    False when the database refused what was written (isolate the outcome that caused it)."""
    if conn.closed or isinstance(exc, psycopg.InterfaceError):
        return True
    # Connection exceptions, rollbacks (deadlock, serialization), resources, operator intervention, system
    # errors; not program limits (class 54: a value nested too deeply for jsonb), which is the value's fault.
    sqlstate = getattr(exc, "sqlstate", None)
    return isinstance(exc, psycopg.OperationalError) and (sqlstate is None or sqlstate[:2] in _RETRIED_CLASSES)


_RETRIED_CLASSES = frozenset({"08", "40", "53", "57", "58"})


def _settle(conn: DictConnection, done_in_transaction: list[Outcome]) -> None:
    """Store the results of jobs done in ctx.transaction(), clear their tokens, then release their dependents."""
    ids = [o.job.id for o in done_in_transaction]
    conn.execute(sql.job_settle_in_transaction, {
        "ids": ids, "lease_tokens": [o.job.lease_token for o in done_in_transaction],
        "results": [o.result_json if o.succeeded else None for o in done_in_transaction]})
    conn.execute(sql.job_release_dependents, {"ids": ids})


def _free_slots(s: WorkerState, outcomes: list[Outcome], handover: Handover | None) -> None:
    """After a write: the outcomes leave the in-flight set, and the dispatcher is woken to claim again (now, for
    a limited queue whose slots were freed and not handed over)."""
    with s.lock:
        for o in outcomes:
            s.in_flight.pop(o.job.id, None)
    limits = s.limits  # (one reading: the dispatcher replaces the mapping when it re-reads the limits)
    freed = {o.job.queue for o in outcomes} & limits.keys()
    for queue_name in freed:
        if limits[queue_name].per_key:  # (only per-key queues read it: fair_hold, keys_to_scan)
            s.job_seconds[queue_name] = flow_limits.typical_job_seconds(
                s.job_seconds.get(queue_name), [o.duration_s for o in outcomes if o.job.queue == queue_name])
    if handover is not None and len(handover.jobs) == sum(o.job.queue == handover.queue for o in outcomes):
        freed.discard(handover.queue)  # (its slots were all handed over: no claim from the dispatcher)
    if freed:
        s.slots_freed += 1
    for queue_name in freed:
        s.idle_until[queue_name] = 0.0  # a slot of a limited queue is free: claim again now
    s.wake.set()


def bounded(outcome: Outcome, settings: Settings) -> Outcome:
    """The outcome within the bounds of the settings: a result over max_result_bytes fails its attempt
    (a completed-in-transaction job keeps no result), error text and traceback are escaped and cut."""
    if outcome.result_json is not None and len(outcome.result_json) * 4 > settings.max_result_bytes:
        try:  # (UTF-8 takes at most 4 bytes a character: most results need no count)
            storable.check_result_size(outcome.result_json, settings.max_result_bytes)
        except storable.NotStorable as exc:
            outcome.result_json, outcome.result = None, None
            if outcome.completed_in_transaction:
                log.error("job %s: result not stored: %s", outcome.job.id, exc)
            else:
                outcome.succeeded, outcome.error = False, f"result not storable: {exc}"
    if outcome.error is not None:
        outcome.error = storable.diagnostic_text(outcome.error, settings.max_error_bytes)
    if outcome.traceback is not None:
        outcome.traceback = storable.diagnostic_text(outcome.traceback, settings.max_traceback_bytes)
    return outcome

"""How a worker's claim runs against the database: its strategy (which statement, and whether it reads the claim
index from the queue's claim cursor), its parameters, its rows, and the claimed jobs made of them.

The dispatcher decides when and how much to claim (workers/dispatcher.py, workers/flow.py); this module only runs
the claim it is given."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from outboxq.db import DictConnection, array_literal
from outboxq.queue import sql
from outboxq.queue.jobs import CLAIM_ORDER
from outboxq.queue.sql import limits as limits_sql
from outboxq.workers.claim_cursor import FROM_THE_FRONT, ClaimCursors
from outboxq.workers.context import JobContext
from outboxq.workers.executor import ClaimedJob, Outcome, completion_params
from outboxq.workers.registry import Consumer
from outboxq.workers.state import WorkerState

log = logging.getLogger("outboxq.worker")


@dataclass(frozen=True)
class ClaimStrategy:
    """A way of claiming: its statement, whether it reads the claim index from the queue's claim cursor (else from
    the front), and whether, in a caller's transaction, it turns that transaction's commit asynchronous."""

    name: str
    statement: str
    from_cursor: bool = False
    # Only an unlimited claim: its jobs may run again after a crash. A limited claim must commit durably (its
    # handlers would run beside the same jobs claimed again, over the limit): durable_transaction.
    commits_async: bool = False


# The unlimited claim (sql.job_claim_batch): on the dispatcher's connection (WorkerState.connect_for_claims) each
# claim statement is a transaction of its own, committed in its one round trip without waiting for the disk; in
# a caller's transaction the SET of asynchronous commit goes in the claim's round trip.
PLAIN = ClaimStrategy("plain", sql.job_claim_batch, from_cursor=True, commits_async=True)
# A limited claim reads from the cursor too: while its limit does not bind, it drains a backlog as the unlimited
# claim does. A claim cut short by its allowance resets the cursor like a backlog that ran out (the next claims
# read from the front, as they did); the rest claimed from the front in the same transaction counts the jobs the
# first statement took (the queue's lock is held until commit).
LIMITED = ClaimStrategy("limited", limits_sql.job_claim_limited, from_cursor=True)
# A per-key claim resumes after its round robin's key (its skip scan starts at each key's first live entry).
PER_KEY = ClaimStrategy("per_key", limits_sql.job_claim_limited_per_key)
# A by-id claim takes its one job.
BY_ID = ClaimStrategy("by_id", sql.job_claim_by_id)
# The claim into the slots a completion frees, in the completer's statement: a slow queue's small claims read
# the claim index from the front (the claim cursor is the dispatcher thread's).
HANDOVER = ClaimStrategy("handover", limits_sql.job_complete_handing_over)

def claim_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A claim's rows in the order the handlers take them: UPDATE ... RETURNING gives none, so claim order
    (priority first)."""
    rows.sort(key=CLAIM_ORDER)
    return rows


@contextmanager
def durable_transaction(conn: DictConnection) -> Iterator[None]:
    """Run the block in a pipeline; on the dispatcher's connection (autocommit, commits not waiting for the
    disk) also as one transaction that commits synchronously: autocommit is off until the block has committed,
    and its first statement turns synchronous commit on. On another connection the block is part of the
    caller's transaction, as it is."""
    own = conn.autocommit
    if own:
        conn.autocommit = False  # (outside the pipeline: inside, changing it costs a round trip)
    try:
        with conn.pipeline():
            if own:
                conn.execute(sql.claim_commit_sync)
            yield
    finally:
        # A block that failed leaves its transaction open: the dispatcher's error handling closes the connection.
        if own and not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
            conn.autocommit = True


class ClaimStatements:
    """Runs one worker's claim statements: a claim's parameters, its rows by its strategy, the jobs made of
    them. `cursors`: where each queue's next claim from the cursor starts."""

    def __init__(self, state: WorkerState, cursors: ClaimCursors):
        self.state = state
        self.cursors = cursors

    def values(self, consumer: Consumer, limit: int) -> dict[str, Any]:
        """A claim's parameters: the queue, how many, a fresh lease token, the lease, the worker, the default
        attempts."""
        s = self.state
        return {
            "queue": consumer.queue,
            "limit": limit,
            "lease_token": uuid.uuid4(),
            "lease_s": consumer.effective_lease_s(s.settings),
            "worker_id": s.worker_id,
            "default_max_attempts": consumer.retry_policy(s.settings).max_attempts,
        }

    def rows(self, conn: DictConnection, strategy: ClaimStrategy, values: dict[str, Any]) -> list[dict[str, Any]]:
        """Run the claim (`values`: its parameters); its rows, uncommitted unless the connection commits each
        statement (or the claim read from the front: _from_cursor)."""
        if not strategy.from_cursor:
            return conn.execute(strategy.statement, {**FROM_THE_FRONT, **values}).fetchall()
        if strategy.commits_async and not conn.autocommit:
            with conn.pipeline():
                conn.execute(sql.claim_commit_async)
                return self._from_cursor(conn, strategy.statement, values)
        return self._from_cursor(conn, strategy.statement, values)

    def _from_cursor(self, conn: DictConnection, statement: str, values: dict[str, Any]) -> list[dict[str, Any]]:
        """Run a claim from the queue's claim cursor; when that comes back short, claim the rest from the front
        of the claim index in the same transaction, or after it on an autocommit connection (either way the jobs
        just claimed are running for the second statement: none comes twice). A claim that reads from the front
        commits here; the caller commits the others."""
        queue = values["queue"]
        cursor = self.cursors.params(queue)
        started = time.monotonic()
        claimed = conn.execute(statement, {**values, **cursor})
        if cursor is FROM_THE_FRONT:
            # Nothing more to claim in this transaction: in the caller's pipeline the COMMIT goes with the claim,
            # one round trip for both (an idle queue's claim, on the path from a notification to a handler).
            conn.commit()
        rows = claimed.fetchall()
        from_front_s = None if cursor is not FROM_THE_FRONT else time.monotonic() - started
        if cursor is not FROM_THE_FRONT and len(rows) < values["limit"]:
            started = time.monotonic()
            try:
                rows += conn.execute(statement, {**values, **FROM_THE_FRONT,
                                                 "limit": values["limit"] - len(rows)}).fetchall()
            except psycopg.Error as exc:
                if not conn.autocommit:
                    raise  # one transaction: the first statement's jobs go back with it
                # On the dispatcher's autocommit connection the first statement's jobs are committed as running
                # under this claim's lease: hand them out rather than leave them to its expiry (and to a retry
                # counted for nothing). The connection's error comes back at its next statement.
                log.warning("dispatcher: the rest of a claim of %s failed (%s); handing out the %d jobs claimed",
                            queue, exc, len(rows))
            from_front_s = time.monotonic() - started
        self.cursors.claimed(queue, rows, values["limit"], from_front_s)
        return rows

    def hand_over(self, conn: DictConnection, consumer: Consumer, to_complete: list[Outcome],
                  handed: list[Outcome], limit: int) -> tuple[uuid.UUID, list[dict[str, Any]]]:
        """Complete `to_complete` and claim up to `limit` jobs into the slots that `handed` free (HANDOVER, in
        the caller's transaction); its claim's lease token and its rows."""
        values = self.values(consumer, limit)
        rows = self.rows(conn, HANDOVER, {
            **values, **completion_params(to_complete),
            "handed_ids": array_literal(o.job.id for o in handed),
            # A lease at least half left: the statement and its commit are long over before it expires.
            "lease_margin_s": values["lease_s"] / 2,
        })
        return values["lease_token"], rows

    def jobs(self, consumer: Consumer, lease_token: uuid.UUID, rows: list[dict[str, Any]]) -> list[ClaimedJob]:
        """The jobs of a claim's rows (in the order given), each with its context."""
        s = self.state
        if rows and rows[0]["queue_failing"]:
            s.failing_queues.add(consumer.queue)
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
                captured_context=job.context or {}, connection_factory=s.thread_connection,
            )
            jobs.append(job)
        return jobs

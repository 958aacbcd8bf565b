"""The dispatcher: claims batches per queue while there is room (SKIP LOCKED, a fresh lease token per claim),
within the queues' limits, and sleeps until notified, a poll is due, or a slot of a limited queue frees up.

How many to claim of each queue, from which keys, and when to claim a queue again is its flow control's
(workers/flow.py); how a claim runs, its strategy's (workers/claims.py)."""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from outboxq.db import DictConnection
from outboxq.queue import limits as flow_limits
from outboxq.queue.sql import limits as limits_sql
from outboxq.workers.claim_cursor import ClaimCursors
from outboxq.workers.claims import (
    LIMITED,
    PER_KEY,
    PLAIN,
    ClaimStatements,
    ClaimStrategy,
    claim_order,
    durable_transaction,
)
from outboxq.workers.executor import ClaimedJob, Outcome
from outboxq.workers.flow import FlowControl
from outboxq.workers.registry import Consumer
from outboxq.workers.state import RECONNECT_DELAY_S, WorkerState

log = logging.getLogger("outboxq.worker")

Order = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


@dataclass
class Handover:
    """What a completion that handed its slots over did: the jobs it completed, and the jobs it claimed into
    their slots (committed with the completion; the completer holds them and hands them out after its commit)."""

    queue: str
    completed_ids: set[int]
    jobs: list[ClaimedJob]


class Dispatcher:
    """Claims jobs for the handler threads (its own thread and connection; the claims into freed slots,
    complete_handing_over, on the completer's)."""

    def __init__(self, state: WorkerState):
        self.state = state
        self.flow = FlowControl(state)
        self.cursors = ClaimCursors()  # where each queue's next claim reads the claim index from
        self.statements = ClaimStatements(state, self.cursors)

    @property
    def limits_known(self) -> bool:
        """Whether the worker has read (and declared) its queues' limits once."""
        return self.flow.limits_known

    # ------------------------------------------------------------------ the loop

    def loop(self) -> None:
        """Claim until the worker stops."""
        s = self.state
        conn: DictConnection | None = None
        while not s.stopping.is_set():
            try:
                if conn is None or conn.closed:
                    conn = s.connect_for_claims()
                now = time.monotonic()
                if self.flow.reading_due(now, idle=False):
                    self.flow.refresh(conn)
                if self._claim_round(conn, now):  # (the rooms are read again for each queue)
                    continue
                if self.flow.reading_due(time.monotonic(), idle=True):
                    self.flow.refresh(conn)
                next_due = min(s.idle_until.values()) - time.monotonic()
                s.wake.wait(timeout=max(0.001, min(s.poll_interval, next_due)) if next_due > 0 else 0.05)
                s.wake.clear()
            except psycopg.Error as exc:
                log.warning("dispatcher: database error (%s); reconnecting", exc)
                if conn is not None:
                    conn.close()
                conn = None
                s.stopping.wait(RECONNECT_DELAY_S)
            except BaseException:
                if conn is not None:  # (the room's guard runs the loop again, on a new connection)
                    conn.close()
                raise
        if conn is not None:
            conn.close()

    def _claim_round(self, conn: DictConnection, now: float) -> bool:
        """Claim each queue that is not idle at `now`; whether any is to be claimed again at once."""
        s = self.state
        again = False
        for queue_name, consumer in s.consumers.items():
            if s.stopping.is_set() or s.idle_until[queue_name] > now:
                continue
            again = self._claim_queue(conn, consumer) or again
        return again

    def _claim_queue(self, conn: DictConnection, consumer: Consumer) -> bool:
        """Claim what the flow control allows of the consumer's queue and hand it to the handlers; whether the
        queue is to be claimed again at once (else it idles as long as the flow control says)."""
        s = self.state
        limits = s.limits.get(consumer.queue)
        wanted = self.flow.wanted(limits)
        if wanted <= 0:
            return False
        slots_freed = s.slots_freed
        if limits is None:
            jobs = self.claim(conn, consumer, wanted)
        else:
            jobs = self.claim_limited(conn, consumer, limits, wanted)
        for job in jobs:
            s.work.put(job)
        idle_s = self.flow.idle_after(conn, consumer, limits, wanted, len(jobs), slots_freed)
        if idle_s is None:
            return True
        s.idle_until[consumer.queue] = time.monotonic() + idle_s
        return False

    # ------------------------------------------------------------------ claims

    def claim(self, conn: DictConnection, consumer: Consumer, limit: int, strategy: ClaimStrategy = PLAIN,
              params: dict[str, Any] | None = None, order: Order | None = None) -> list[ClaimedJob]:
        """Claim up to `limit` jobs of the consumer's queue under a fresh lease token (committed), handed to the
        handlers in claim order (priority, run_at, id), or in the order `order` gives the rows."""
        values = {**self.statements.values(consumer, limit), **(params or {})}
        rows = self.statements.rows(conn, strategy, values)
        if not conn.autocommit:  # (on the dispatcher's autocommit connection each statement committed already)
            conn.commit()
        self.state.stats["claims"] += 1
        if not rows:
            return []
        jobs = self.statements.jobs(consumer, values["lease_token"], (order or claim_order)(rows))
        self.hold(jobs)
        return jobs

    def claim_limited(self, conn: DictConnection, consumer: Consumer, limits: flow_limits.QueueLimits,
                      limit: int) -> list[ClaimedJob]:
        """Claim up to `limit` jobs of a limited queue, within its limits (committed).

        Far from its limits, in a shared claim slot: claims side by side, each leaving room for those in flight
        beside it. Otherwise, and for what a shared claim left, in an exclusive one, which counts every job
        running and every start (the slots: outboxq.queue.sql.limits)."""
        jobs: list[ClaimedJob] = []
        # Shared only on the dispatcher's own connection, where each claim commits before the next: in a
        # caller's transaction the shared slot would still be held while the exclusive claim waits for every
        # slot, and two such claims would deadlock.
        if conn.autocommit and flow_limits.shares_claim_slots(limits, limit):
            jobs, held_back = self._claim_in_slot(conn, consumer, limits, limit, shared=True)
            if len(jobs) == limit or (jobs and not held_back):
                return jobs  # (short of jobs, not of room: an exclusive claim would find no more)
            limit -= len(jobs)
        try:
            return jobs + self._claim_in_slot(conn, consumer, limits, limit, shared=False)[0]
        except psycopg.Error as exc:
            if not jobs:
                raise
            # The shared claim's jobs are committed as running under its lease: hand them out rather than leave
            # them to its expiry (and to a retry counted for nothing). The error comes back at the next statement.
            log.warning("dispatcher: the exclusive claim after a shared one of %s failed (%s); handing out the "
                        "%d jobs claimed", consumer.queue, exc, len(jobs))
            return jobs

    def _claim_in_slot(self, conn: DictConnection, consumer: Consumer, limits: flow_limits.QueueLimits,
                       limit: int, *, shared: bool) -> tuple[list[ClaimedJob], bool]:
        """One limited claim, in a shared claim slot or holding them all (committed); its jobs, and whether the
        reserve for the claims beside it held jobs back (False when it claimed nothing: it cannot tell)."""
        held_back = False

        def noted(order: Order) -> Order:
            def note_then_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
                nonlocal held_back
                held_back = bool(rows[0]["held_back"])
                return order(rows)
            return note_then_order

        # One round trip for the slot and the claim (a pipeline); still two statements, two snapshots.
        with durable_transaction(conn):
            if shared:
                conn.execute(limits_sql.queue_limit_claim_shared,
                             {"queue": consumer.queue, "first_slot": random.randrange(limits_sql.CLAIM_SLOTS)})
            else:
                conn.execute(limits_sql.queue_limit_claim_exclusive, {"queue": consumer.queue})
            # (Planned once per connection, not before every claim: the worker's own connections plan so for the
            # whole session already, a caller's connection for this claim.)
            conn.execute(limits_sql.claim_generic_plan)
            reserve = {"reserve": limits_sql.SHARED_RESERVE if shared else 0}
            if not limits.per_key:
                jobs = self.claim(conn, consumer, limit, LIMITED, params=reserve, order=noted(claim_order))
                return jobs, held_back
            turn = self.flow.key_turn(consumer.queue, limits, limit)
            jobs = self.claim(conn, consumer, limit, PER_KEY, params={**turn.params(), **reserve},
                              order=noted(functools.partial(self.flow.turn_claimed, turn)))
            self.flow.turn_ended(turn, len(jobs))
            return jobs, held_back

    def hold(self, jobs: list[ClaimedJob]) -> None:
        """Count claimed jobs as this worker's (in flight, waiting for a handler)."""
        s = self.state
        with s.lock:
            for job in jobs:
                s.in_flight[job.id] = job
            s.buffered += len(jobs)
        s.stats["claimed"] += len(jobs)

    # ------------------------------------------------------------------ claims into freed slots (the completer's)

    def complete_handing_over(self, conn: DictConnection, to_complete: list[Outcome],
                              outcomes: list[Outcome]) -> Handover | None:
        """Complete these jobs and, in the same statement, claim the next jobs of a queue that hands its slots
        over (FlowControl.hands_over) into the slots they free (the completer's write; one statement, one round
        trip). None when no queue among them hands over: the completer completes them as usual. The jobs claimed
        are not held yet: the completer hands them out once its write has committed (Handover)."""
        s = self.state
        if s.stopping.is_set():
            return None
        room = self.flow.handover_room(to_complete, outcomes)
        if room is None:
            return None
        consumer = s.consumers[room.queue]
        lease_token, rows = self.statements.hand_over(conn, consumer, to_complete, room.handed, room.limit)
        claimed = claim_order([r for r in rows if r["id"] is not None])
        return Handover(queue=room.queue, completed_ids=set(rows[0]["completed_ids"] or ()),
                        jobs=self.statements.jobs(consumer, lease_token, claimed))

    def prepare_handovers(self, conn: DictConnection) -> None:
        """Run the completion that hands slots over once with no job where a consumer declares a limit that hands
        over (the completer, on connecting): a new session's first run of it reads the catalog and plans it, off
        the path from a job's end to the next one's start. (A limit an operator set is
        not foreseen: its first handover pays that.)"""
        for consumer in self.state.consumers.values():
            if self.flow.hands_over(consumer.limits):
                self.statements.hand_over(conn, consumer, [], [], 1)
                return  # (one run prepares the statement for every queue)

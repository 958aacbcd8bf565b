"""The dispatcher: claims batches per queue while there is room (SKIP LOCKED, a fresh lease token per claim),
within the queues' limits, and sleeps until notified, a poll is due, or a slot of a limited queue frees up."""

from __future__ import annotations

import logging
import queue as queue_module
import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from outboxq.db import DictConnection, array_literal
from outboxq.queue import limits as flow_limits
from outboxq.queue import sql
from outboxq.queue.jobs import CLAIM_ORDER
from outboxq.queue.sql import limits as limits_sql
from outboxq.workers.claim_cursor import FROM_THE_FRONT, ClaimCursors
from outboxq.workers.context import JobContext
from outboxq.workers.executor import ClaimedJob, Outcome, completion_params
from outboxq.workers.registry import Consumer
from outboxq.workers.state import RECONNECT_DELAY_S, WorkerState

log = logging.getLogger("outboxq.worker")

# A limited queue whose claim came back short is claimed again after this (its slots free up as other
# workers' jobs finish, and its rate window slides), rather than after the poll interval.
LIMITED_RECHECK_S = 0.05

# Keyless jobs of a per-key queue (limits_sql.job_keyless_window): how many of its front jobs a look reads, and
# how soon the next look may run (it follows the claims that come back short, and every reading of the limits):
# at once after a full window, soon after one that found some, later after one that found none (where a limit
# binds, claims come back short every LIMITED_RECHECK_S: a look each time would read the window 20 times a
# second).
ADOPT_WINDOW = 1_000
ADOPT_INTERVAL_S = 0.2
ADOPT_IDLE_INTERVAL_S = 1.0
# The look at the newest jobs (limits_sql.job_keyless_newest) reads at most this many jobs a queue past the
# last look's place.
ADOPT_NEWEST_WINDOW = 5_000


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
        self._limits_read_at: float | None = None
        self._limit_cursor: dict[str, str] = {}  # per-key queues: where the round robin resumes
        self._key_depth: dict[str, float] = {}  # per-key queues: the jobs per key the last full claim showed
        self._claim_again: set[str] = set()  # per-key queues whose claim scanned too few keys (see below)
        self._adopt_due: dict[str, float] = {}  # per-key queues: when the next look for keyless jobs may run
        # The look at the newest jobs: where a queue's next look starts, (created_xid, id) of the last job it read.
        self._newest_after: dict[str, tuple[int, int]] = {}
        self._newest_due = 0.0  # when that look may run again
        self.cursors = ClaimCursors()  # other queues: where the next claim reads the claim index from

    def loop(self) -> None:
        """Claim until the worker stops."""
        s = self.state
        conn: DictConnection | None = None
        while not s.stopping.is_set():
            try:
                if conn is None or conn.closed:
                    conn = s.connect_for_claims()
                claimed_any_full = False
                now = time.monotonic()
                # The limits are re-read while idle (below), off the path from a notification to its claim; a
                # dispatcher that is never idle re-reads them here, at twice the interval.
                if self._limits_read_at is None or now - self._limits_read_at >= 2 * flow_limits.LIMITS_REFRESH_S:
                    self.read_limits(conn)
                    self.adopt_all_keyless(conn)
                for queue_name, consumer in s.consumers.items():
                    if s.stopping.is_set() or s.idle_until[queue_name] > now:
                        continue
                    limits = s.limits.get(queue_name)
                    most_held = self._most_held(limits)
                    room = self._room(most_held)
                    if room <= 0:
                        continue
                    slots_freed = s.slots_freed
                    if limits is None:  # no limit: today's claim, nothing more
                        wanted = min(room, s.batch_size)
                        jobs = self.claim(conn, consumer, wanted)
                    else:
                        # (A limited claim's fixed cost is paid per claim: larger claims, outboxq.queue.limits.)
                        wanted = min(self._limited_room(limits, room, most_held), s.limited_claim_size)
                        if wanted <= 0:
                            continue  # every handler is busy: a completion wakes the dispatcher
                        jobs = self.claim_limited(conn, consumer, limits, wanted)
                    for job in jobs:
                        s.work.put(job)
                    # (After the jobs went to the handlers: a failure of the look must not strand them.)
                    if limits is not None and limits.per_key and len(jobs) < wanted and self.adopt_keyless(
                            conn, consumer):
                        self._claim_again.add(queue_name)  # (the jobs just given a key can be claimed)
                    claim_again = queue_name in self._claim_again
                    self._claim_again.discard(queue_name)
                    if len(jobs) < wanted and not (limits is not None and s.slots_freed != slots_freed) and (
                            not claim_again):
                        # (A limited queue whose slot freed while it was being claimed is claimed again at once:
                        # the completer's wake-up came before this claim's short answer.)
                        s.idle_until[queue_name] = time.monotonic() + (
                            s.poll_interval if limits is None else min(s.poll_interval, LIMITED_RECHECK_S))
                    else:
                        claimed_any_full = True
                if claimed_any_full:  # (the rooms are read again for each queue)
                    continue
                if self._limits_read_at is not None and (
                        time.monotonic() - self._limits_read_at >= flow_limits.LIMITS_REFRESH_S):
                    self.read_limits(conn)
                    self.adopt_all_keyless(conn)
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

    def _room(self, most_held: int) -> int:
        """How many more jobs the worker may claim, holding at most `most_held` (0 while its handlers still have
        enough claimed work to start)."""
        s = self.state
        with s.lock:
            in_flight, buffered = len(s.in_flight), s.buffered
        # Claim again only while the handlers risk running dry (a quarter batch left unstarted): fast jobs get
        # the next batch while the last one is being completed; slow jobs are not hoarded by one worker.
        if buffered >= max(s.concurrency, s.batch_size // 4):
            return 0
        return most_held - in_flight

    def _most_held(self, limits: flow_limits.QueueLimits | None) -> int:
        """How many jobs the worker may hold (claimed, running or being written) when it claims a queue: two
        batches; two of a limited queue's larger claims where nothing the worker holds can make its limit bind,
        while the worker's other queues are idle (their last claims came back short): holding more than two
        batches of one queue, it would leave no room for another queue's claims."""
        s = self.state
        if limits is not None and self._cannot_bind_holding(limits, s.max_in_flight_limited):
            now = time.monotonic()
            if all(until > now for queue, until in s.idle_until.items() if queue != limits.queue):
                return s.max_in_flight_limited
        return s.max_in_flight

    # ------------------------------------------------------------------ flow control (outboxq.queue.limits)

    @property
    def limits_known(self) -> bool:
        """Whether the worker has read (and declared) its queues' limits once."""
        return self._limits_read_at is not None

    def read_limits(self, conn: DictConnection) -> None:
        """Read the limits of this worker's queues, having declared its consumers' limits where they differ from
        those stored (at start), or are missing (later: flow_limits.declaration_changes)."""
        s = self.state
        with durable_transaction(conn):
            stored = flow_limits.load(conn)
            # (At start every declaration that differs; later only a row gone: flow_limits.declaration_changes.)
            changes = [c.limits for c in s.consumers.values() if flow_limits.declaration_changes(
                c.limits, stored.get(c.queue), starting=self._limits_read_at is None)]
            for declared in changes:
                flow_limits.declare(conn, declared)
            if changes:
                stored = flow_limits.load(conn)
            conn.commit()
        # (Replaced once committed: a reading that fails leaves the limits the hand-back compares with.)
        before, s.limits = s.limits, {q: lim for q, lim in stored.items() if q in s.consumers and lim.limited}
        self._limits_read_at = time.monotonic()
        self._hand_back_over_new_limits(conn, before)

    def _hand_back_over_new_limits(self, conn: DictConnection, before: dict[str, flow_limits.QueueLimits]) -> None:
        """Hand back the unstarted jobs of the queues whose limits can bind this worker's buffer now and could not
        when their jobs were claimed (a limit added, or lowered, since the last reading): claimed beyond the new
        limit, they would start beyond it, for as long as the worker's buffer of them lasts. Their next claims
        are counted against the new limits."""
        s = self.state
        queues = {q for q, lim in s.limits.items()
                  if not self._buffer_cannot_bind(lim) and (q not in before or self._buffer_cannot_bind(before[q]))}
        if not queues or s.stopping.is_set():  # (stopping: the shutdown hands back every unstarted job)
            return
        taken: list[ClaimedJob] = []
        kept: list[ClaimedJob | None] = []
        while True:  # (the handlers may take some meanwhile: those start, as they would have a moment before)
            try:
                job = s.work.get_nowait()
            except queue_module.Empty:
                break
            if job is not None and job.queue in queues:
                taken.append(job)
            else:
                kept.append(job)
        for job in kept:
            s.work.put(job)
        if not taken:
            return
        with s.lock:
            s.buffered -= len(taken)
        s.hand_back(conn, taken)
        log.info("handed back %d unstarted jobs of %s: their limits changed since they were claimed",
                 len(taken), ", ".join(sorted({j.queue for j in taken})))

    def adopt_all_keyless(self, conn: DictConnection) -> None:
        """adopt_keyless for each of this worker's per-key queues (after each reading of the limits)."""
        for queue_name, limits in self.state.limits.items():
            if limits.per_key:
                self.adopt_keyless(conn, self.state.consumers[queue_name])

    def adopt_keyless(self, conn: DictConnection, consumer: Consumer) -> int:
        """Give a limit key to the keyless jobs at the front of a per-key queue (limits_sql.job_keyless_window:
        enqueued where its consumer was not known), computed by its consumer's limit_by as enqueue would, the
        shared NO_LIMIT_KEY where that gives none or fails; how many. At most every ADOPT_INTERVAL_S, but at once
        again after a full window. On the dispatcher's connection: each statement commits (a key lost in a
        crash is given again)."""
        queue = consumer.queue
        now = time.monotonic()
        newest = self._adopt_newest_keyless(conn, now)
        # (The other queues keyed by that look are claimed again at once; this one's caller does so from the count.)
        for other in newest:
            if other != queue:
                self._claim_again.add(other)
                self.state.idle_until[other] = 0.0
        adopted = newest.get(queue, 0)
        if now < self._adopt_due.get(queue, 0.0):
            return adopted
        rows = conn.execute(limits_sql.job_keyless_window, {"queue": queue, "window": ADOPT_WINDOW}).fetchall()
        self._adopt_due[queue] = now + (0.0 if len(rows) >= ADOPT_WINDOW else ADOPT_INTERVAL_S if rows
                                        else ADOPT_IDLE_INTERVAL_S)
        self._set_limit_keys(conn, rows)
        return adopted + len(rows)

    def _adopt_newest_keyless(self, conn: DictConnection, now: float) -> dict[str, int]:
        """The keyless jobs among the newest of this worker's per-key queues given their key (whatever the
        backlog ahead of them: limits_sql.job_keyless_newest, in commit order); how many per queue. At most every
        ADOPT_INTERVAL_S (ADOPT_IDLE_INTERVAL_S after a look that found none), at once again while behind. A
        queue's first look starts after the jobs whose enqueue has ended (those enqueued while no worker looked are
        left to the front window)."""
        queues = [q for q, limits in self.state.limits.items() if limits.per_key and q in self.state.consumers]
        if not queues or now < self._newest_due:
            return {}
        start = conn.execute(limits_sql.job_newest_place).fetchall()[0]
        # (A queue that stopped being per key forgets its place; one without a place starts now, and so does one
        # whose place is past every transaction id the server has given: its ids went back, as after a failover
        # to a standby that was behind.)
        self._newest_after = {q: place for q, place in self._newest_after.items()
                              if q in queues and place[0] < start["xmax"]}
        places = [self._newest_after.setdefault(q, (start["xmin"], 0)) for q in queues]
        rows = conn.execute(limits_sql.job_keyless_newest, {
            "queues": queues, "after_xids": [p[0] for p in places], "after_ids": [p[1] for p in places],
            "window": ADOPT_NEWEST_WINDOW}).fetchall()
        keyless = [r for r in rows if r["id"] is not None]
        self._set_limit_keys(conn, keyless)
        # (Moved on only once the keys are written: a look that failed reads the same jobs again.)
        behind = False
        for r in rows:
            self._newest_after[r["queue"]] = (r["last_xid"], r["last_id"])
            behind = behind or r["scanned"] >= ADOPT_NEWEST_WINDOW
        self._newest_due = now + (0.0 if behind else ADOPT_INTERVAL_S if keyless else ADOPT_IDLE_INTERVAL_S)
        adopted: dict[str, int] = {}
        for r in keyless:
            adopted[r["queue"]] = adopted.get(r["queue"], 0) + 1
        return adopted

    def _set_limit_keys(self, conn: DictConnection, rows: list[dict[str, Any]]) -> None:
        """Store the limit key of each of these keyless jobs (rows with id, queue, payload, payload_bytes),
        computed by its queue's consumer (_limit_key_for); committed durably."""
        if not rows:
            return
        consumers = self.state.consumers
        # (In id order, the order every look locks them in: two workers keying the same jobs cannot deadlock.)
        rows = sorted(rows, key=lambda r: r["id"])
        limit_keys = [self._limit_key_for(consumers[r["queue"]], r) for r in rows]
        # (Durable: the look moves past these jobs once this returns; a key lost in a crash would leave them to
        # the front window.)
        with durable_transaction(conn):
            conn.execute(limits_sql.job_set_limit_keys, {"ids": [r["id"] for r in rows], "limit_keys": limit_keys})
            conn.commit()

    @staticmethod
    def _limit_key_for(consumer: Consumer, row: dict[str, Any]) -> str:
        """A stored job's limit key, as enqueue would have computed it from its payload."""
        if consumer.limit_by is None:
            return flow_limits.NO_LIMIT_KEY
        try:
            payload = row["payload"]
            if row["payload_bytes"] is not None and consumer.decode is not None:
                payload = consumer.decode(bytes(row["payload_bytes"]))
            return flow_limits.job_limit_key(consumer.limit_by, payload)
        except Exception as exc:  # (the consumer's own decode or limit_by: the job still runs, under no key)
            log.warning("dispatcher: no limit key for job %s of %s (%s): it runs under the shared empty key",
                        row["id"], consumer.queue, exc)
            return flow_limits.NO_LIMIT_KEY

    @staticmethod
    def _cannot_bind_holding(limits: flow_limits.QueueLimits, held: int) -> bool:
        """Whether a worker holding `held` jobs of the queue cannot make its limits bind: no rate limit, and a
        concurrency limit (global, or per key) of at least that, or none."""
        return limits.rate_limit_count is None and (limits.global_concurrency is None
                                                    or limits.global_concurrency >= held)

    def _buffer_cannot_bind(self, limits: flow_limits.QueueLimits) -> bool:
        """A concurrency limit (global, or per key) at least what this worker may hold cannot be made to bind by
        this worker's buffer: claim full batches, as an unlimited queue does (the claim still caps each key)."""
        return self._cannot_bind_holding(limits, self.state.max_in_flight)

    def _limited_room(self, limits: flow_limits.QueueLimits, room: int, most_held: int) -> int:
        """How many jobs of a limited queue to claim. Where the limit can bind (a rate limit, a concurrency,
        global or per key, below what this worker may hold), only as many as there are idle handlers: a job
        claimed is a job started, so the starts stay within the rate limit and no worker holds slots it cannot
        use. `most_held`: what the worker may hold of the queue (_most_held)."""
        s = self.state
        if self._buffer_cannot_bind(limits):
            if not limits.per_key:
                return room
            # Per key: what this worker holds runs before the job of a key that arrives later, so it holds only
            # a short time's work (outboxq.queue.limits.fair_hold), measured from its handlers' run times.
            hold = flow_limits.fair_hold(s.concurrency, s.job_seconds.get(limits.queue), most_held)
            with s.lock:
                return min(room, hold - len(s.in_flight))
        with s.lock:
            return min(room, s.concurrency - len(s.in_flight))

    def hands_over(self, limits: flow_limits.QueueLimits) -> bool:
        """Whether the slots that a queue's completions free go straight to its next jobs, in the completion's
        statement (limits_sql.job_complete_handing_over): a global concurrency limit that can bind within this
        worker, and no other limit (a start must be counted in the rate window; a key's slot is not another
        key's)."""
        return limits.rate_limit_count is None and not limits.per_key and not self._buffer_cannot_bind(limits)

    def complete_handing_over(self, conn: DictConnection, to_complete: list[Outcome],
                              outcomes: list[Outcome]) -> Handover | None:
        """Complete these jobs and, in the same statement, claim the next jobs of a queue that hands its slots
        over (hands_over) into the slots they free (the completer's write; one statement, one round trip). None
        when no queue among them hands over: the completer completes them as usual. The jobs claimed are not
        held yet: the completer hands them out once its write has committed (Handover)."""
        s = self.state
        if s.stopping.is_set():
            return None
        for queue_name, limits in s.limits.items():
            if not self.hands_over(limits):
                continue
            handed = [o for o in to_complete if o.job.queue == queue_name]
            if not handed:
                continue
            with s.lock:  # the outcomes' jobs still count in in_flight until written
                idle = s.concurrency - (len(s.in_flight) - len(outcomes))
            if idle <= 0:
                return None
            consumer = s.consumers[queue_name]
            lease_token, rows = self._complete_handing_over(conn, consumer, to_complete, handed, min(len(handed), idle))
            claimed = claim_order([r for r in rows if r["id"] is not None])
            return Handover(queue=queue_name, completed_ids=set(rows[0]["completed_ids"] or ()),
                            jobs=self._claimed_jobs(consumer, lease_token, claimed))
        return None

    def prepare_handovers(self, conn: DictConnection) -> None:
        """Run the completion that hands slots over once with no job where a consumer declares a limit that hands
        over (the completer, on connecting): a new session's first run of it reads the catalog and plans it
        (11-12 ms measured), off the path from a job's end to the next one's start. (A limit an operator set is
        not foreseen: its first handover pays that.)"""
        for consumer in self.state.consumers.values():
            if self.hands_over(consumer.limits):
                self._complete_handing_over(conn, consumer, [], [], 1)
                return  # (one run prepares the statement for every queue)

    def _complete_handing_over(self, conn: DictConnection, consumer: Consumer, to_complete: list[Outcome],
                               handed: list[Outcome], limit: int) -> tuple[uuid.UUID, list[dict[str, Any]]]:
        """Run limits_sql.job_complete_handing_over; its claim's lease token and its rows."""
        values = self._claim_values(consumer, limit)
        # A slow queue's small claims read the claim index from the front: the claim cursor is the dispatcher
        # thread's.
        rows = conn.execute(limits_sql.job_complete_handing_over, {
            **values, **FROM_THE_FRONT, **completion_params(to_complete),
            "handed_ids": array_literal(o.job.id for o in handed),
            # A lease at least half left: the statement and its commit are long over before it expires.
            "lease_margin_s": values["lease_s"] / 2,
        }).fetchall()
        return values["lease_token"], rows

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

        def noted(order: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Any:
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
                jobs = self.claim(conn, consumer, limit, statement=limits_sql.job_claim_limited, params=reserve,
                                  order=noted(claim_order))
                return jobs, held_back
            queue = consumer.queue
            self._claim_again.discard(queue)
            after_key = self._limit_cursor.get(queue, "")
            depth = self._key_depth.pop(queue, None)
            # (Fewer keys only where no key's limit can bind: where one can, the claims are small, and a key at
            # its limit among fewer keys would cut them short.)
            max_keys = flow_limits.keys_to_scan(limit, depth if self._buffer_cannot_bind(limits) else None,
                                                self.state.job_seconds.get(queue))

            def round_robin(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
                # Handlers take the batch in round-robin order too (every key's first job, then every key's
                # second...): a key that just arrived does not wait behind another key's share of the batch.
                # The next claim resumes after the last key served.
                ordered, self._limit_cursor[queue] = flow_limits.round_robin(rows, after_key)
                shown = flow_limits.key_depth_shown(rows, limit)
                if shown is not None:
                    self._key_depth[queue] = shown
                return ordered

            jobs = self.claim(conn, consumer, limit, statement=limits_sql.job_claim_limited_per_key,
                              params={"after_key": after_key, "max_keys": max_keys, **reserve},
                              order=noted(round_robin))
            if len(jobs) < limit and max_keys < flow_limits.key_budget(limit):
                # Short after scanning fewer keys than it might have: the rest may lie in the keys after them
                # (the queue is not idle); the dispatcher claims again at once, scanning every key.
                self._claim_again.add(queue)
            return jobs, held_back

    def _claim_from_cursor(self, conn: DictConnection, queue: str, statement: str,
                           values: dict[str, Any]) -> list[dict[str, Any]]:
        """Run a claim from the queue's claim cursor; when that comes back short, claim the rest from the front
        of the claim index in the same transaction, or after it on an autocommit connection (either way the jobs
        just claimed are running for the second statement: none comes twice). A claim that reads from the front
        commits here; the caller commits the others."""
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

    def claim(self, conn: DictConnection, consumer: Consumer, limit: int,
              statement: str = sql.job_claim_batch, params: dict[str, Any] | None = None,
              order: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None) -> list[ClaimedJob]:
        """Claim up to `limit` jobs of the consumer's queue under a fresh lease token (committed), handed to the
        handlers in claim order (priority, run_at, id), or in the order `order` gives the rows."""
        values = {**self._claim_values(consumer, limit), **(params or {})}
        if statement is sql.job_claim_batch and conn.autocommit:
            # The dispatcher's connection (WorkerState.connect_for_claims): each claim statement is a transaction
            # of its own, committed in its one round trip without waiting for the disk.
            rows = self._claim_from_cursor(conn, consumer.queue, statement, values)
        elif statement is sql.job_claim_batch:  # a caller's transaction: the SET goes in the claim's round trip
            with conn.pipeline():
                conn.execute(sql.claim_commit_async)
                rows = self._claim_from_cursor(conn, consumer.queue, statement, values)
        elif statement is limits_sql.job_claim_limited:
            # A limited claim reads from the cursor too: while its limit does not bind, it drains a backlog as the
            # unlimited claim does. A claim cut short by its allowance resets the cursor like a backlog that ran
            # out (the next claims read from the front, as they did); the rest claimed from the front in the same
            # transaction counts the jobs the first statement took (the queue's lock is held until commit).
            rows = self._claim_from_cursor(conn, consumer.queue, statement, values)
        else:
            # A per-key claim resumes after its round robin's key (its skip scan starts at each key's first live
            # entry); a by-id claim takes its one job.
            rows = conn.execute(statement, {**FROM_THE_FRONT, **values}).fetchall()
        if not conn.autocommit:  # (on the dispatcher's autocommit connection each statement committed already)
            conn.commit()
        if not rows:
            return []
        jobs = self._claimed_jobs(consumer, values["lease_token"], (order or claim_order)(rows))
        self.hold(jobs)
        return jobs

    def _claim_values(self, consumer: Consumer, limit: int) -> dict[str, Any]:
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

    def _claimed_jobs(self, consumer: Consumer, lease_token: uuid.UUID,
                      rows: list[dict[str, Any]]) -> list[ClaimedJob]:
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
                captured_context=job.context, connection_factory=s.thread_connection,
            )
            jobs.append(job)
        return jobs

    def hold(self, jobs: list[ClaimedJob]) -> None:
        """Count claimed jobs as this worker's (in flight, waiting for a handler)."""
        s = self.state
        with s.lock:
            for job in jobs:
                s.in_flight[job.id] = job
            s.buffered += len(jobs)
        s.stats["claimed"] += len(jobs)

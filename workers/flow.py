"""Flow control for a worker's dispatcher (outboxq.queue.limits): its queues' limits (declared and read), how
many jobs of each queue to claim and from which keys (workers/key_turns.py), whether a queue is claimed again at
once after a claim, which completions hand their slots over, the unstarted jobs handed back when a limit changes,
and the keyless jobs of per-key queues given their key (workers/keyless.py).

The dispatcher asks it how many to claim and tells it what each claim took; the claims themselves are the
dispatcher's (workers/dispatcher.py, workers/claims.py)."""

from __future__ import annotations

import logging
import queue as queue_module
import time
from typing import Any, NamedTuple

from outboxq.db import DictConnection
from outboxq.queue import limits as flow_limits
from outboxq.workers.claims import durable_transaction
from outboxq.workers.executor import ClaimedJob, Outcome
from outboxq.workers.key_turns import KeyTurn, KeyTurns
from outboxq.workers.keyless import KeylessLooks
from outboxq.workers.registry import Consumer
from outboxq.workers.state import WorkerState

log = logging.getLogger("outboxq.worker")

# A limited queue whose claim came back short is claimed again after this (its slots free up as other
# workers' jobs finish, and its rate window slides), rather than after the poll interval.
LIMITED_RECHECK_S = 0.05


class HandoverRoom(NamedTuple):
    """A queue whose completions hand their slots over: its outcomes among those written, and how many jobs to
    claim into their slots."""

    queue: str
    handed: list[Outcome]
    limit: int


class FlowControl:
    """One worker's flow control (its dispatcher's thread; the handover decision on the completer's)."""

    def __init__(self, state: WorkerState):
        self.state = state
        self.turns = KeyTurns()
        self.keyless = KeylessLooks(state)
        self._read_at: float | None = None  # when the limits were last read
        self._claim_again: set[str] = set()  # queues to claim again at once, though their last claim was short

    # ------------------------------------------------------------------ the limits

    @property
    def limits_known(self) -> bool:
        """Whether the worker has read (and declared) its queues' limits once."""
        return self._read_at is not None

    def reading_due(self, now: float, *, idle: bool) -> bool:
        """Whether to read the limits again: at once before the first reading; then every LIMITS_REFRESH_S
        while the dispatcher is idle, off the path from a notification to its claim, and at twice that
        interval for a dispatcher that is never idle."""
        if self._read_at is None:
            return not idle
        return now - self._read_at >= (1 if idle else 2) * flow_limits.LIMITS_REFRESH_S

    def refresh(self, conn: DictConnection) -> None:
        """Read the limits, then look for keyless jobs in every per-key queue."""
        self.read_limits(conn)
        self.adopt_all_keyless(conn)

    def read_limits(self, conn: DictConnection) -> None:
        """Read the limits of this worker's queues, having declared its consumers' limits where they differ from
        those stored (at start), or are missing (later: flow_limits.declaration_changes)."""
        s = self.state
        with durable_transaction(conn):
            stored = flow_limits.load(conn)
            # (At start every declaration that differs; later only a row gone: flow_limits.declaration_changes.)
            changes = [c.limits for c in s.consumers.values() if flow_limits.declaration_changes(
                c.limits, stored.get(c.queue), starting=self._read_at is None)]
            for declared in changes:
                flow_limits.declare(conn, declared)
            if changes:
                stored = flow_limits.load(conn)
            conn.commit()
        # (Replaced once committed: a reading that fails leaves the limits the hand-back compares with.)
        before, s.limits = s.limits, {q: lim for q, lim in stored.items() if q in s.consumers and lim.limited}
        self._read_at = time.monotonic()
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

    # ------------------------------------------------------------------ keyless jobs (workers/keyless.py)

    def adopt_all_keyless(self, conn: DictConnection) -> None:
        """adopt_keyless for each of this worker's per-key queues (after each reading of the limits)."""
        for queue_name, limits in self.state.limits.items():
            if limits.per_key:
                self.adopt_keyless(conn, self.state.consumers[queue_name])

    def adopt_keyless(self, conn: DictConnection, consumer: Consumer) -> int:
        """Give a limit key to the keyless jobs of the consumer's per-key queue, at its front and among the newest
        of every per-key queue (KeylessLooks); how many of this queue's. The other queues keyed are claimed again
        at once; this one's caller does so from the count."""
        queue = consumer.queue
        now = time.monotonic()
        newest = self.keyless.look_newest(conn, now)
        for other in newest:
            if other != queue:
                self._claim_again.add(other)
                self.state.idle_until[other] = 0.0
        return newest.get(queue, 0) + self.keyless.look_front(conn, consumer, now)

    # ------------------------------------------------------------------ how many

    def wanted(self, limits: flow_limits.QueueLimits | None) -> int:
        """How many jobs to claim now of a queue with these limits (None: no limit); 0: none, the worker holds
        enough (or, limited, every handler is busy: a completion wakes the dispatcher)."""
        s = self.state
        most_held = self.most_held(limits)
        room = self.room(most_held)
        if room <= 0:
            return 0
        if limits is None:
            return min(room, s.batch_size)
        # (A limited claim's fixed cost is paid per claim: larger claims, outboxq.queue.limits.)
        return max(0, min(self._limited_room(limits, room, most_held), s.limited_claim_size))

    def room(self, most_held: int) -> int:
        """How many more jobs the worker may claim, holding at most `most_held` (0 while its handlers still have
        enough claimed work to start)."""
        s = self.state
        with s.lock:
            in_flight, buffered = len(s.in_flight), s.buffered
        if buffered >= s.refill_below:  # (the handlers have enough claimed work to start)
            return 0
        return most_held - in_flight

    def most_held(self, limits: flow_limits.QueueLimits | None) -> int:
        """How many jobs the worker may hold (claimed, running or being written) when it claims a queue: two
        batches; two of a limited queue's larger claims where nothing the worker holds can make its limit bind,
        while the worker's other queues are idle (their last claims came back short): holding more than two
        batches of one queue, it would leave no room for another queue's claims."""
        s = self.state
        if limits is not None and _cannot_bind_holding(limits, s.max_in_flight_limited):
            now = time.monotonic()
            if all(until > now for queue, until in s.idle_until.items() if queue != limits.queue):
                return s.max_in_flight_limited
        return s.max_in_flight

    def _limited_room(self, limits: flow_limits.QueueLimits, room: int, most_held: int) -> int:
        """How many jobs of a limited queue to claim. Where the limit can bind (a rate limit, a concurrency,
        global or per key, below what this worker may hold), only as many as there are idle handlers: a job
        claimed is a job started, so the starts stay within the rate limit and no worker holds slots it cannot
        use. `most_held`: what the worker may hold of the queue (most_held)."""
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

    def _buffer_cannot_bind(self, limits: flow_limits.QueueLimits) -> bool:
        """A concurrency limit (global, or per key) at least what this worker may hold cannot be made to bind by
        this worker's buffer: claim full batches, as an unlimited queue does (the claim still caps each key)."""
        return _cannot_bind_holding(limits, self.state.max_in_flight)

    # ------------------------------------------------------------------ from which keys (workers/key_turns.py)

    def key_turn(self, queue: str, limits: flow_limits.QueueLimits, limit: int) -> KeyTurn:
        """The turn of a per-key claim of up to `limit` jobs of the queue (it scans fewer keys, taking more of
        each, only where no key's limit can bind)."""
        self._claim_again.discard(queue)
        return self.turns.next_turn(queue, limit, deep_turns=self._buffer_cannot_bind(limits),
                                    job_seconds=self.state.job_seconds.get(queue))

    def turn_claimed(self, turn: KeyTurn, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows a per-key claim took (some), in the order the handlers take them (KeyTurns.claimed)."""
        return self.turns.claimed(turn, rows)

    def turn_ended(self, turn: KeyTurn, claimed: int) -> None:
        """A per-key claim took `claimed` jobs: one cut short over fewer keys is claimed again at once."""
        if turn.cut_short(claimed):
            self._claim_again.add(turn.queue)

    # ------------------------------------------------------------------ after a claim

    def idle_after(self, conn: DictConnection, consumer: Consumer, limits: flow_limits.QueueLimits | None,
                   wanted: int, claimed: int, slots_freed: int) -> float | None:
        """After the dispatcher's claim of `wanted` jobs of the queue took `claimed` (handed to the handlers
        already): how long the queue idles before its next claim, None to claim it again at once (the claim was
        full, keyless jobs were just given a key, its turn was cut short, or, limited, a slot freed while it was
        being claimed: `slots_freed` is state.slots_freed from before the claim)."""
        s = self.state
        queue = consumer.queue
        short = claimed < wanted
        # (A failure of the look raises here, after the jobs went to the handlers: it must not strand them.)
        if limits is not None and limits.per_key and short and self.adopt_keyless(conn, consumer):
            self._claim_again.add(queue)  # (the jobs just given a key can be claimed)
        claim_again = queue in self._claim_again
        self._claim_again.discard(queue)
        # (A limited queue whose slot freed while it was being claimed is claimed again at once: the completer's
        # wake-up came before this claim's short answer.)
        if not short or claim_again or (limits is not None and s.slots_freed != slots_freed):
            return None
        return s.poll_interval if limits is None else min(s.poll_interval, LIMITED_RECHECK_S)

    # ------------------------------------------------------------------ handovers

    def hands_over(self, limits: flow_limits.QueueLimits) -> bool:
        """Whether the slots that a queue's completions free go straight to its next jobs, in the completion's
        statement (limits_sql.job_complete_handing_over): a global concurrency limit that can bind within this
        worker, and no other limit (a start must be counted in the rate window; a key's slot is not another
        key's)."""
        return limits.rate_limit_count is None and not limits.per_key and not self._buffer_cannot_bind(limits)

    def handover_room(self, to_complete: list[Outcome], outcomes: list[Outcome]) -> HandoverRoom | None:
        """The first queue among `to_complete` that hands its slots over, with how many jobs to claim into them
        (no more than the handlers idle once `outcomes` are written); None when none does, or no handler would
        be idle."""
        s = self.state
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
            return HandoverRoom(queue_name, handed, min(len(handed), idle))
        return None


def _cannot_bind_holding(limits: flow_limits.QueueLimits, held: int) -> bool:
    """Whether a worker holding `held` jobs of the queue cannot make its limits bind: no rate limit, and a
    concurrency limit (global, or per key) of at least that, or none."""
    return limits.rate_limit_count is None and (limits.global_concurrency is None
                                                or limits.global_concurrency >= held)

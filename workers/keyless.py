"""The looks for keyless jobs of per-key queues: jobs enqueued where their consumer was not known have no limit
key; the worker gives them the key enqueue would have computed (outboxq.queue.limits.job_limit_key), the shared
NO_LIMIT_KEY where that gives none or fails. Two looks: at the front of a queue (limits_sql.job_keyless_window),
and at the newest jobs of every per-key queue, whatever the backlog ahead of them
(limits_sql.job_keyless_newest)."""

from __future__ import annotations

import logging
from typing import Any

from outboxq.db import DictConnection
from outboxq.queue import limits as flow_limits
from outboxq.queue.sql import limits as limits_sql
from outboxq.workers.claims import durable_transaction
from outboxq.workers.registry import Consumer
from outboxq.workers.state import WorkerState

log = logging.getLogger("outboxq.worker")

# How many of a queue's front jobs a look reads, and how soon the next look may run (it follows the claims that
# come back short, and every reading of the limits): at once after a full window, soon after one that found
# some, later after one that found none (where a limit binds, claims come back short every LIMITED_RECHECK_S: a
# look each time would read the window 20 times a second).
ADOPT_WINDOW = 1_000
ADOPT_INTERVAL_S = 0.2
ADOPT_IDLE_INTERVAL_S = 1.0
# The look at the newest jobs reads at most this many jobs a queue past the last look's place.
ADOPT_NEWEST_WINDOW = 5_000


class KeylessLooks:
    """One worker's looks for keyless jobs (on the dispatcher's connection: each statement commits, and a key
    lost in a crash is given again)."""

    def __init__(self, state: WorkerState):
        self.state = state
        self._front_due: dict[str, float] = {}  # per queue: when the next look at its front may run
        # The look at the newest jobs: where a queue's next look starts, (created_xid, id) of the last job it read.
        self._newest_after: dict[str, tuple[int, int]] = {}
        self._newest_due = 0.0  # when that look may run again

    def look_front(self, conn: DictConnection, consumer: Consumer, now: float) -> int:
        """Give a limit key to the keyless jobs at the front of the consumer's queue; how many. At most every
        ADOPT_INTERVAL_S, but at once again after a full window."""
        queue = consumer.queue
        if now < self._front_due.get(queue, 0.0):
            return 0
        rows = conn.execute(limits_sql.job_keyless_window, {"queue": queue, "window": ADOPT_WINDOW}).fetchall()
        self._front_due[queue] = now + (0.0 if len(rows) >= ADOPT_WINDOW else ADOPT_INTERVAL_S if rows
                                        else ADOPT_IDLE_INTERVAL_S)
        self._set_limit_keys(conn, rows)
        return len(rows)

    def look_newest(self, conn: DictConnection, now: float) -> dict[str, int]:
        """Give a limit key to the keyless jobs among the newest of this worker's per-key queues (whatever the
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
        computed by its queue's consumer (limit_key_for); committed durably."""
        if not rows:
            return
        consumers = self.state.consumers
        # (In id order, the order every look locks them in: two workers keying the same jobs cannot deadlock.)
        rows = sorted(rows, key=lambda r: r["id"])
        limit_keys = [limit_key_for(consumers[r["queue"]], r) for r in rows]
        # (Durable: the look moves past these jobs once this returns; a key lost in a crash would leave them to
        # the front window.)
        with durable_transaction(conn):
            conn.execute(limits_sql.job_set_limit_keys, {"ids": [r["id"] for r in rows], "limit_keys": limit_keys})
            conn.commit()


def limit_key_for(consumer: Consumer, row: dict[str, Any]) -> str:
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

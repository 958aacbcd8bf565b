"""The scheduler thread: enqueue one job per slot of this worker's periodic schedules, whoever else runs.

Each worker that defines schedules runs one, on its own connection. A slot is claimed in PostgreSQL: the due
schedule's row is locked (FOR UPDATE SKIP LOCKED) while its slots' jobs are enqueued and its next_slot moved
on, in one transaction; and each slot's job has the key periodic:{name}:{slot}, unique forever, so no crash,
race or restart can make a second job for one slot. Jobs are enqueued at their slot's time (the thread
sleeps until the soonest slot, at most MAX_SLEEP_S), so the new-job notification wakes idle workers at once.

Missed slots: a slot counts as missed when its time passed more than MISSED_GRACE_S before this scheduler
started (no scheduler was running then: one that was would have enqueued it); the schedule's `missed` policy
decides which of those run. Slots that came due while this scheduler ran are never dropped.

A schedule whose slots cannot be computed (periodic() refuses those it can tell at declaration; a Schedule made
by hand is not checked) is logged and left out for SCHEDULE_RETRY_S, then tried again; the others go on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from datetime import datetime, timedelta

from outboxq.db import DictConnection, one_row
from outboxq.queue.enqueue import enqueue
from outboxq.queue.sql import schedules as periodic_sql
from outboxq.workers.connected_thread import ConnectedThread
from outboxq.workers.periodic import Schedule, slot_key
from outboxq.workers.rooms import Rooms

log = logging.getLogger("outboxq.scheduler")

MAX_SLEEP_S = 1.0
# Longer than a running scheduler's longest sleep: a slot this old at our start was due while no scheduler
# ran (or while every one of them was stalled).
MISSED_GRACE_S = 2.0
# A schedule whose next slot could not be computed is left out this long; then its definition is written again
# (which keeps its place in the database) and it is tried again.
SCHEDULE_RETRY_S = 60.0


class Scheduler(ConnectedThread):
    """Enqueues the slots of `schedules` for one worker process."""

    def __init__(self, url: str, schedules: Iterable[Schedule], rooms: Rooms | None = None):
        super().__init__(url, "scheduler", log, rooms)
        self.schedules = {s.name: s for s in schedules}
        self.started_at: datetime | None = None  # the database's clock when this scheduler first wrote
        self.enqueued = 0
        self.failing: dict[str, float] = {}  # schedules left out, each with when (time.monotonic()) to retry it

    def connected(self, conn: DictConnection) -> None:
        """Write this worker's schedules at each (re)connect."""
        self.declare(conn)

    def step(self, conn: DictConnection) -> float:
        """One tick."""
        return self.tick(conn)

    def declare(self, conn: DictConnection, schedules: Iterable[Schedule] | None = None) -> None:
        """Write this worker's schedules, or these of them (committed); the first call sets started_at."""
        now = one_row(conn.execute(periodic_sql.schedule_soonest, {"names": []}))["now"]
        for s in self.schedules.values() if schedules is None else schedules:
            try:
                next_slot = s.next_after(now)
            except Exception as exc:  # (whatever croniter or datetime raise: this schedule's fault alone)
                self._failed(s, exc)
                continue
            self.failing.pop(s.name, None)
            conn.execute(periodic_sql.schedule_upsert, {
                "name": s.name, "queue": s.queue, "spec": s.spec, "timezone": s.timezone, "missed": s.missed,
                "payload": json.dumps(s.payload), "next_slot": next_slot,
            })
        conn.commit()
        if self.started_at is None:
            self.started_at = now

    def tick(self, conn: DictConnection) -> float:
        """Enqueue what is due; the seconds until the next slot (at most MAX_SLEEP_S)."""
        retry = [self.schedules[name] for name, at in self.failing.items() if at <= time.monotonic()]
        if retry:
            self.declare(conn, retry)
        row = one_row(conn.execute(periodic_sql.schedule_soonest, {"names": self._names()}))
        conn.commit()
        if row["soonest"] is None:
            return MAX_SLEEP_S
        wait_s = (row["soonest"] - row["now"]).total_seconds()
        if wait_s > 0:
            return min(MAX_SLEEP_S, wait_s)
        self.run_due(conn)
        return 0.0

    def run_due(self, conn: DictConnection) -> int:
        """Enqueue the due slots of every due schedule not locked by another worker (committed); how many."""
        assert self.started_at is not None
        missed_before = self.started_at - timedelta(seconds=MISSED_GRACE_S)
        enqueued = 0
        for row in conn.execute(periodic_sql.schedule_lock_due, {"names": self._names()}).fetchall():
            schedule = self.schedules[row["name"]]
            try:  # (every slot computed before the first is enqueued: a failure leaves the schedule as it was)
                due = schedule.slots_between(row["next_slot"], row["now"])
                to_run = slots_to_run(schedule.missed, due, missed_before)
                next_slot = schedule.next_after(row["now"])
            except Exception as exc:  # (whatever croniter or datetime raise: this schedule's fault alone)
                self._failed(schedule, exc)
                continue
            last_job_id = None
            for slot in to_run:
                job = enqueue(conn, schedule.queue, schedule.payload, key=slot_key(schedule.name, slot),
                              run_at=slot, on_conflict="ignore")
                last_job_id = job.id
            conn.execute(periodic_sql.schedule_advance, {
                "name": schedule.name, "last_slot": due[-1] if due else None,
                "next_slot": next_slot, "last_job_id": last_job_id,
            })
            if len(to_run) < len(due):
                log.info("periodic %s: %d missed slots, %d run (missed=%s)", schedule.name, len(due),
                         len(to_run), schedule.missed)
            enqueued += len(to_run)
        conn.commit()
        self.enqueued += enqueued
        return enqueued

    def _names(self) -> list[str]:
        """The schedules this scheduler looks at: all but those left out after a failure."""
        return [name for name in self.schedules if name not in self.failing]

    def _failed(self, schedule: Schedule, exc: Exception) -> None:
        """Leave out a schedule whose slots could not be computed, until SCHEDULE_RETRY_S from now."""
        log.error("periodic %s (%s): its slots cannot be computed (%s: %s); it is left out, and tried again in "
                  "%g s", schedule.name, schedule.spec, type(exc).__name__, exc, SCHEDULE_RETRY_S, exc_info=exc)
        self.failing[schedule.name] = time.monotonic() + SCHEDULE_RETRY_S


def slots_to_run(policy: str, due: list[datetime], missed_before: datetime) -> list[datetime]:
    """Which of the due slots (oldest first) to enqueue: every slot on time, and of the missed ones (due
    before `missed_before`) all, the latest, or none."""
    missed = [s for s in due if s < missed_before]
    on_time = due[len(missed):]
    if policy == "all":
        return due
    if policy == "latest":
        return missed[-1:] + on_time
    return on_time

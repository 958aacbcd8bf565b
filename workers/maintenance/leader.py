"""Maintenance led by one worker at a time: rescue, promote and prune on their own thread and connection.

Every worker process runs a Maintenance thread, but only the one holding outboxq's maintenance advisory lock
(session level, on the thread's own connection) does any work; the others try to take the lock once per
poll interval. When the leader dies its connection closes and PostgreSQL releases the lock, so another
worker takes over within a poll interval or two. Each service has its own interval and a bounded amount of
work per tick, and none of them shares a thread or a connection with the heartbeats: a long prune can no
longer hold back a lease renewal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from outboxq.db import DictConnection, one_row
from outboxq.queue import sql
from outboxq.queue.backoff import RetryPolicy
from outboxq.registry import Registry, default_registry
from outboxq.settings import Settings
from outboxq.workers.connected_thread import ConnectedThread
from outboxq.workers.maintenance import promote, prune, rescue
from outboxq.workers.rooms import Rooms

log = logging.getLogger("outboxq.maintenance")

PRUNE_INTERVAL_S = 60.0
# While a prune finds a full batch it goes on this soon, one batch per tick, instead of in one long loop.
PRUNE_BACKLOG_INTERVAL_S = 0.05


class Service:
    """A maintenance pass with its own interval; `run(conn)` does a bounded amount of work and returns
    True when it left work behind (it then runs again after `backlog_interval_s`)."""

    def __init__(self, name: str, run: Callable[[DictConnection], bool], interval_s: float,
                 backlog_interval_s: float | None = None):
        self.name, self.run, self.interval_s = name, run, interval_s
        self.backlog_interval_s = interval_s if backlog_interval_s is None else backlog_interval_s
        self.due = 0.0

    def tick(self, conn: DictConnection, now: float) -> None:
        """Run the pass if it is due, and schedule the next one."""
        if now < self.due:
            return
        more = self.run(conn)
        self.due = time.monotonic() + (self.backlog_interval_s if more else self.interval_s)


def _promote(conn: DictConnection) -> bool:
    promote.run_once(conn)
    return False


def _prune(conn: DictConnection) -> bool:
    return prune.run_once(conn, max_batches=1) >= prune.BATCH_LIMIT


def default_services(poll_interval: float,
                     policy_of: Callable[[str], RetryPolicy] = rescue.policy_of_queue) -> list[Service]:
    """Rescue and promote every poll interval, prune every minute (one batch per tick while it has a backlog);
    rescue decides each job's fate with `policy_of(queue)`."""
    def _rescue(conn: DictConnection) -> bool:
        return len(rescue.run_once(conn, policy_of=policy_of)) >= rescue.BATCH_LIMIT

    return [
        Service("rescue", _rescue, poll_interval, backlog_interval_s=0.0),
        Service("promote", _promote, poll_interval),
        Service("prune", _prune, PRUNE_INTERVAL_S, backlog_interval_s=PRUNE_BACKLOG_INTERVAL_S),
    ]


class Maintenance(ConnectedThread):
    """The maintenance thread of one worker: leads (holds the advisory lock) or waits to lead."""

    def __init__(self, url: str, settings: Settings, *, poll_interval: float, worker_id: str,
                 services: list[Service] | None = None, registry: Registry | None = None,
                 rooms: Rooms | None = None):
        self.settings, self.worker_id = settings, worker_id
        super().__init__(url, "maintenance", log, rooms)
        self.poll_interval = max(0.05, poll_interval)
        self.services = services if services is not None else default_services(
            self.poll_interval, rescue.policies_of(registry or default_registry, settings))
        self.is_leader = False

    def step(self, conn: DictConnection) -> float:
        """Lead if nobody does; while leading, run the services that are due."""
        if not self.is_leader:
            self._set_leader(self._try_lead(conn))
        if self.is_leader:
            self._tick(conn)
        return self._sleep_s()

    def connected(self, conn: DictConnection) -> None:
        """A new connection holds no lock yet."""
        self._set_leader(False)

    def disconnected(self) -> None:
        """A closed connection released the lock: another worker leads from its next try."""
        self._set_leader(False)

    def _try_lead(self, conn: DictConnection) -> bool:
        row = one_row(conn.execute(sql.maintenance_leader_try, {"name": self._lock_name()}))
        conn.commit()
        return bool(row["leader"])

    def _lock_name(self) -> str:
        # One leader per outboxq instance: instances in other schemas of the database have their own.
        return f"outboxq_maintenance:{self.settings.db_schema}"

    def _tick(self, conn: DictConnection) -> None:
        for service in self.services:
            if self._stopping.is_set():
                return
            service.tick(conn, time.monotonic())

    def _sleep_s(self) -> float:
        if not self.is_leader:
            return self.poll_interval
        soonest = min(s.due for s in self.services) - time.monotonic()
        return min(self.poll_interval, max(0.0, soonest))

    def _set_leader(self, leader: bool) -> None:
        if leader != self.is_leader:
            log.info("worker %s %s maintenance", self.worker_id, "now leads" if leader else "no longer leads")
        self.is_leader = leader


def leader_of(conn: Any, schema: str) -> int | None:
    """The backend pid holding the maintenance lock of `schema`'s instance, or None (for status and tests)."""
    row = conn.execute(sql.maintenance_leader_pid, {"name": f"outboxq_maintenance:{schema}"}).fetchone()
    if row is None:
        return None
    return row["pid"] if isinstance(row, dict) else row[0]

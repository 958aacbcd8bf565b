"""The guard every room of a worker runs its loop under, and the rooms' health: an error a room can recover
from is logged and its loop runs again; one it cannot stops the worker, which then exits non-zero."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from outboxq.queue.storable import safe_str

log = logging.getLogger("outboxq.worker")

# A room whose loop raised runs it again after this pause (no spinning on an error that comes back at once)...
ROOM_RETRY_DELAY_S = 1.0
# ...unless that was its ROOM_MAX_FAILURES-th failure within ROOM_FAILURE_WINDOW_S: an error that comes back
# every time is not going away in this process, and a new one (its supervisor restarts it) is the next thing
# to try; meanwhile the worker would look alive while that room did nothing.
ROOM_MAX_FAILURES = 5
ROOM_FAILURE_WINDOW_S = 60.0


class Rooms:
    """The health of a worker's rooms, and the guard each room's loop runs under (Rooms.guard).

    A loop that raises is logged (ERROR, its traceback, the room's name) and run again after ROOM_RETRY_DELAY_S:
    one error (a bug met by one job, schedule or notification) must not leave a worker running without its
    dispatcher, heartbeat or scheduler while it looks healthy. Fatal, instead: an error that is no Exception, a
    MemoryError, and a room's ROOM_MAX_FAILURES-th failure within ROOM_FAILURE_WINDOW_S. A fatal error ends the
    room, which health() then reports dead, and calls on_fatal (the worker stops: Worker.run raises
    WorkerFailed).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.on_fatal: Callable[[], None] = lambda: None
        self.fatal = threading.Event()  # set once a room failed beyond recovery
        # Guarded by `lock`: the rooms guarded so far, each room's failures (all, and the times of the recent
        # ones), its last error, and the rooms that died with what killed them.
        self.rooms: set[str] = set()
        self.failures: dict[str, int] = defaultdict(int)
        self.last_error: dict[str, str] = {}
        self.dead: dict[str, str] = {}
        self._recent: dict[str, deque[float]] = defaultdict(deque)

    def guard(self, room: str, loop: Callable[[], None],
              pause: threading.Event | None = None) -> Callable[[], None]:
        """`loop` as a thread's target: run again after each recoverable failure, following a pause of
        ROOM_RETRY_DELAY_S (cut short when `pause` is set, for example by a stopping worker: the loop then
        returns at once); done when the loop returns, or after a fatal failure."""
        with self.lock:
            self.rooms.add(room)

        def guarded() -> None:
            while True:
                try:
                    loop()
                    return
                except BaseException as exc:  # each failure is either survived or fatal, and logged either way
                    if not self._survives(room, exc):
                        return
                if pause is None:
                    time.sleep(ROOM_RETRY_DELAY_S)
                else:
                    pause.wait(ROOM_RETRY_DELAY_S)

        return guarded

    def _survives(self, room: str, exc: BaseException) -> bool:
        """Count and log a failure of `room`; False when it is fatal (then on_fatal was called)."""
        now = time.monotonic()
        with self.lock:
            self.failures[room] += 1
            self.last_error[room] = f"{type(exc).__name__}: {safe_str(exc)}"
            recent = self._recent[room]
            recent.append(now)
            while recent[0] < now - ROOM_FAILURE_WINDOW_S:
                recent.popleft()
            repeated = len(recent) >= ROOM_MAX_FAILURES
            fatal = repeated or isinstance(exc, MemoryError) or not isinstance(exc, Exception)
            if fatal:
                self.dead[room] = self.last_error[room]
        if not fatal:
            log.error("worker room %s failed (%s); it goes on in %g s", room, self.last_error[room],
                      ROOM_RETRY_DELAY_S, exc_info=exc)
            return True
        why = (f"{len(recent)} failures within {ROOM_FAILURE_WINDOW_S:g} s" if repeated
               else "an error it cannot recover from")
        log.critical("worker room %s failed (%s), %s: the worker stops", room, self.last_error[room], why,
                     exc_info=exc)
        self.fatal.set()
        self.on_fatal()
        return False

    def health(self) -> dict[str, Any]:
        """{"healthy": no room died, "rooms": {room: {"alive", "failures", "last_error"}}}."""
        with self.lock:
            rooms = {room: {"alive": room not in self.dead, "failures": self.failures.get(room, 0),
                            "last_error": self.last_error.get(room)} for room in sorted(self.rooms)}
            return {"healthy": not self.dead, "rooms": rooms}

    def collect(self) -> Iterator[Metric]:
        """outboxq_worker_room_up (0 once a room died) and outboxq_worker_room_failures, by room: the worker's
        metrics registry collects them (the prometheus-client collector protocol)."""
        rooms = self.health()["rooms"]
        up = GaugeMetricFamily("outboxq_worker_room_up", "1 while a room of the worker runs, 0 once it died",
                               labels=["room"])
        failures = CounterMetricFamily("outboxq_worker_room_failures", "Errors a room's loop raised, by room",
                                       labels=["room"])
        for room, health in rooms.items():
            up.add_metric([room], 1 if health["alive"] else 0)
            failures.add_metric([room], health["failures"])
        yield up
        yield failures

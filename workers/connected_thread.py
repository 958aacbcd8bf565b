"""A background thread with a database connection of its own, reconnecting after errors (the scheduler and
the maintenance leader are two), its loop guarded by the worker's Rooms (workers/rooms.py)."""

from __future__ import annotations

import logging
import threading

import psycopg
from psycopg.rows import dict_row

from outboxq.db import DictConnection
from outboxq.workers.rooms import Rooms

RECONNECT_DELAY_S = 0.5


class ConnectedThread:
    """Runs `step(conn)` in a loop on its own connection until stopped; a database error closes the connection,
    calls `disconnected()`, and reconnects after RECONNECT_DELAY_S; any other error does the same, then the
    thread's room (`room` in `rooms`: its worker's, else its own) logs it and runs the loop again, or stops it
    when fatal. Subclasses define step, and may define connected(conn) (after each connect) and disconnected()
    (after each loss, and once at the end)."""

    def __init__(self, url: str, room: str, log: logging.Logger, rooms: Rooms | None = None):
        self.url, self.log = url, log
        self._stopping = threading.Event()
        self.rooms = rooms or Rooms()
        self.thread = threading.Thread(target=self.rooms.guard(room, self._run, self._stopping),
                                       name=f"outboxq-{room}", daemon=True)

    def start(self):  # noqa: ANN201 - returns the subclass instance
        """Start the thread; returns at once."""
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the current step; the connection is closed."""
        self._stopping.set()
        self.thread.join(timeout=timeout)

    def step(self, conn: DictConnection) -> float:
        """Do one bounded piece of work; the seconds to wait before the next one."""
        raise NotImplementedError

    def connected(self, conn: DictConnection) -> None:
        """Called after each (re)connect."""

    def disconnected(self) -> None:
        """Called after the connection was lost or closed."""

    def _run(self) -> None:
        conn: DictConnection | None = None
        while not self._stopping.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, row_factory=dict_row)
                    self.connected(conn)
                sleep_s = self.step(conn)
            except psycopg.Error as exc:
                self.log.warning("%s: database error (%s); reconnecting", self.thread.name, exc)
                if conn is not None:
                    conn.close()
                conn = None
                self.disconnected()
                sleep_s = RECONNECT_DELAY_S
            except BaseException:
                # (The room's guard runs the loop again on a new connection: this one, and the advisory lock
                # the maintenance leader holds on it, must not outlive the failed loop.)
                if conn is not None:
                    conn.close()
                self.disconnected()
                raise
            self._stopping.wait(sleep_s)
        if conn is not None:
            conn.close()
        self.disconnected()

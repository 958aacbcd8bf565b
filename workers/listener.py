"""The LISTEN connection: a hint that new work was committed. Polling stays the truth."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from outboxq.queue import sql
from outboxq.workers.rooms import Rooms

log = logging.getLogger("outboxq.worker")


class Listener:
    """Calls `on_notify(queue)` for each notification on the outboxq channel, reconnecting when cut; its loop
    runs under the room "listener" of `rooms` (its worker's, else its own)."""

    def __init__(self, url: str, on_notify: Callable[[str], None], *, reconnect_delay_s: float = 0.5,
                 rooms: Rooms | None = None):
        self.url = url
        self.on_notify = on_notify
        self.reconnect_delay_s = reconnect_delay_s
        self._stopping = threading.Event()
        self._conn: psycopg.Connection | None = None
        self.ready = threading.Event()  # set once LISTEN is in place (tests wait for it before enqueueing)
        self.rooms = rooms or Rooms()
        self.thread = threading.Thread(target=self.rooms.guard("listener", self._run, self._stopping),
                                       name="outboxq-listener", daemon=True)

    def start(self) -> None:
        """Start listening in a background thread."""
        self.thread.start()

    def stop(self) -> None:
        """Stop listening and close the connection."""
        self._stopping.set()
        self.thread.join(timeout=3)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True) as conn:
                    self._conn = conn
                    conn.execute(sql.job_notifications_listen)
                    self.ready.set()
                    # Wake every queue once after (re)connecting: notifications sent meanwhile were lost.
                    self.on_notify("*")
                    while not self._stopping.is_set():
                        for notify in conn.notifies(timeout=0.5):
                            self.on_notify(notify.payload)
            except psycopg.Error as exc:
                self.ready.clear()
                if self._stopping.is_set():
                    return
                log.warning("listener connection lost (%s); reconnecting", exc)
                self._stopping.wait(self.reconnect_delay_s)
            except BaseException:
                self.ready.clear()  # (the room's guard runs the loop again: LISTEN is in place again once ready)
                raise

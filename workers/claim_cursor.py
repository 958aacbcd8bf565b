"""Where a worker's next claim of a queue starts reading the claim index (dead rows).

A claim takes the first ready jobs in (priority, run_at, id) order. A claimed job's entry stays in the claim
index until vacuum removes it, and while any transaction holds an old snapshot vacuum may not: every claim
that reads the index from the front walks the entries of every job claimed so far, and a long drain slows
down claim after claim. So while a queue has a backlog, each claim starts after the last job the previous
one took (sql.CLAIM_CURSOR), and reads only what is new.

What a claim from the cursor cannot see, a claim from the front picks up: a job that sorts before the cursor
(a higher priority, a run_at in the past, a job committed late or released by a dependency, a row another
transaction held locked). A claim from the front happens
- whenever a claim from the cursor comes back short (the rest is claimed from the front in the same
  transaction), and every claim after a short one, so an idle queue is always read from the front;
- at least every FULL_SCAN_MIN_S during a backlog, or less often when a claim from the front is slow (it then
  takes at most FULL_SCAN_SHARE of the time): such a job waits that long at most.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

FULL_SCAN_MIN_S = 1.0
FULL_SCAN_SHARE = 0.05

# The claim statements' cursor parameters when the claim reads from the front.
FROM_THE_FRONT: dict[str, Any] = {"after_priority": None, "after_run_at": None, "after_id": None}


@dataclass
class _Cursor:
    after: tuple[int, datetime, int] | None = None
    front_due: float = 0.0  # time.monotonic() when the next claim reads from the front


class ClaimCursors:
    """The claim cursor of each queue of one worker (its claims, on the dispatcher's thread or a caller's)."""

    def __init__(self) -> None:
        self._cursors: dict[str, _Cursor] = {}
        self._lock = threading.Lock()

    def params(self, queue: str) -> dict[str, Any]:
        """The cursor parameters of the queue's next claim."""
        with self._lock:
            cursor = self._cursors.get(queue)
            if cursor is None or cursor.after is None or time.monotonic() >= cursor.front_due:
                return FROM_THE_FRONT
            priority, run_at, job_id = cursor.after
        return {"after_priority": priority, "after_run_at": run_at, "after_id": job_id}

    def claimed(self, queue: str, rows: list[dict[str, Any]], limit: int, from_front_s: float | None) -> None:
        """Record a claim: its rows, what it asked for, and how long its read from the front took (None: it read
        only from the cursor)."""
        # Only the queued jobs' places: a job claimed on its first attempt came from the claim index (a retry
        # comes from the retry index, in its own order). A queued job on a later attempt is left out too: the
        # cursor can only end up lower, which skips nothing.
        fresh = [(r["priority"], r["run_at"], r["id"]) for r in rows if r["attempts"] == 1]
        with self._lock:
            cursor = self._cursors.setdefault(queue, _Cursor())
            if from_front_s is not None:
                cursor.front_due = time.monotonic() + max(FULL_SCAN_MIN_S, from_front_s / FULL_SCAN_SHARE)
            if len(rows) < limit:
                cursor.after = None  # the backlog ran out: the next claim reads from the front
            elif fresh:
                cursor.after = max(fresh)

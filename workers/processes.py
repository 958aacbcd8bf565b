"""`outboxq worker --processes N`: N worker processes under one supervisor, so one worker uses several cores.

One Python process runs its handlers, claims and completions under one GIL; a second process claims and
completes while the first waits on PostgreSQL (the drain is bound by two serial statement streams
with the cores partly idle). Each child is a whole `outboxq worker` (its own connections, leases and
heartbeat); nothing is shared but the database, exactly as between workers on different hosts.

The supervisor
- starts the children with the same options (`--metrics-port P` becomes P, P+1, ... one port per child);
- forwards SIGTERM/SIGINT to every child and waits for them (each stops gracefully: its unstarted jobs go
  back to the queue), then exits 0 if they all did;
- restarts a child that dies while it runs (after RESTART_DELAY_S), unless the child failed at start
  (within FAILED_START_S, for example a handler module that does not import): then it stops the others and
  exits 1 rather than restart a child that cannot run;
- is not needed by the children to stay safe: a child whose supervisor is SIGKILLed gets SIGTERM from the
  kernel (Linux PR_SET_PDEATHSIG) and stops gracefully too.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger("outboxq.worker")

RESTART_DELAY_S = 1.0
FAILED_START_S = 5.0
_PR_SET_PDEATHSIG = 1


try:  # loaded once here, not in the forked child
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover
    _LIBC = None


def _die_with(parent_pid: int) -> Callable[[], None]:
    """What a child runs between fork and exec: ask the kernel for SIGTERM when its parent dies (Linux;
    elsewhere nothing), and exit at once if the parent died before that request was made."""
    def request() -> None:  # pragma: no cover - runs in the child
        prctl = getattr(_LIBC, "prctl", None)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:
            os._exit(1)
    return request


class Supervisor:
    """Runs `count` child processes, each given by child_argv(index), until stopped."""

    def __init__(self, count: int, child_argv: Callable[[int], Sequence[str]]):
        if count < 1:
            raise ValueError("a worker needs at least one process")
        self.count = count
        self.child_argv = child_argv
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self._started_at: dict[int, float] = {}
        self._stopping = threading.Event()

    def _start(self, index: int) -> None:
        argv = [sys.executable, "-m", "outboxq.cli", *self.child_argv(index)]
        self.children[index] = subprocess.Popen(argv, preexec_fn=_die_with(os.getpid()))  # noqa: PLW1509 - no threads run user code here
        self._started_at[index] = time.monotonic()
        log.info("worker process %d started (pid %d)", index, self.children[index].pid)

    def request_stop(self) -> None:
        """Stop every child (SIGTERM) and return from run() once they have exited."""
        self._stopping.set()

    def run(self) -> int:
        """Start the children, keep them running until request_stop(), then stop them. The exit code."""
        for index in range(self.count):
            self._start(index)
        failed = False
        while not self._stopping.wait(0.2):
            for index, child in list(self.children.items()):
                code = child.poll()
                if code is None:
                    continue
                if time.monotonic() - self._started_at[index] < FAILED_START_S:
                    log.error("worker process %d exited with %s at start: stopping the others", index, code)
                    failed = True
                    self._stopping.set()
                    break
                log.warning("worker process %d (pid %d) exited with %s: restarting it in %.0f s",
                            index, child.pid, code, RESTART_DELAY_S)
                del self.children[index]  # (a stop during the delay must not count its exit code)
                if self._stopping.wait(RESTART_DELAY_S):
                    break
                self._start(index)
        return self._stop_children() or int(failed)

    def _stop_children(self) -> int:
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        worst = 0
        for index, child in self.children.items():
            code = child.wait()
            log.info("worker process %d (pid %d) exited with %s", index, child.pid, code)
            worst = worst or (0 if code in (0, -signal.SIGTERM) else 1)
        return worst


# "auto" runs one process per core up to this many: every process holds its own connections (about five: the
# dispatcher, completer, heartbeat, listener and maintenance), and a 64-core host must not take 320.
MAX_AUTO_PROCESSES = 4


def default_count() -> int:
    """What --processes auto means here: one process per core this process may run on, at most
    MAX_AUTO_PROCESSES."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_AUTO_PROCESSES))

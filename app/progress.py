"""A one-line progress display on stderr for long commands (demo, bench, chaos, spark run)."""

from __future__ import annotations

import sys
import time


class Progress:
    """One status line on stderr (redrawn on a terminal), plus a permanent line per finished step."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.live = enabled and sys.stderr.isatty()
        self.prefix = ""
        self._last = 0.0

    def update(self, text: str, force: bool = False) -> None:
        """Redraw the status line (at most 10 times a second)."""
        if not self.live:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        sys.stderr.write(f"\r\x1b[K{self.prefix}{text}")
        sys.stderr.flush()

    def done(self, text: str) -> None:
        """A line that stays."""
        if not self.enabled:
            return
        sys.stderr.write(("\r\x1b[K" if self.live else "") + f"{self.prefix}{text}\n")
        sys.stderr.flush()

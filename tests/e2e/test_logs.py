"""Log lines: OUTBOXQ_LOG_FORMAT, readable on a terminal, JSON otherwise; job fields on every job line."""

from __future__ import annotations

import json
import logging

import pytest

from outboxq.logs import configure_logging
from outboxq.settings import get_settings


@pytest.mark.parametrize("log_format, json_lines", [("json", True), ("text", False), ("auto", True)])
def test_log_format_follows_the_setting(monkeypatch, capsys, log_format, json_lines):
    monkeypatch.setenv("OUTBOXQ_LOG_FORMAT", log_format)
    get_settings.cache_clear()
    try:
        configure_logging("INFO")  # stderr is captured here, not a terminal: "auto" means JSON
        logging.getLogger("outboxq.test").info("hello", extra={"queue": "emails", "job_id": 7})
        line = capsys.readouterr().err.strip().splitlines()[-1]
    finally:
        get_settings.cache_clear()
        logging.getLogger().handlers.clear()
    if json_lines:
        assert json.loads(line)["message"] == "hello" and json.loads(line)["job_id"] == 7
    else:
        assert line.endswith("hello [queue=emails job_id=7]")


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_20_mb_message_is_logged_cut_to_the_line_bound(monkeypatch, capsys, log_format):
    monkeypatch.setenv("OUTBOXQ_LOG_FORMAT", log_format)
    monkeypatch.setenv("OUTBOXQ_MAX_LOG_LINE_BYTES", "4096")
    get_settings.cache_clear()
    try:
        configure_logging("INFO")
        try:
            raise ValueError("v" * 20_000_000)
        except ValueError as exc:
            logging.getLogger("outboxq.test").error("job 7 failed (%s)", "e" * 20_000_000, exc_info=exc)
        err = capsys.readouterr().err
    finally:
        get_settings.cache_clear()
        logging.getLogger().handlers.clear()
    assert "more bytes]" in err and "job 7 failed (eee" in err
    assert len(err.encode()) < 3 * 4096  # the message and the exception, each cut to the bound

"""Handlers and helpers for the runtime tests (subprocess workers import this with `--handlers`)."""

from __future__ import annotations

import os
import threading
import time
from contextvars import ContextVar

import psycopg
import pytest

from outboxq.registry import default_registry
from outboxq.workers import JobContext, consumer
from tests.support import status_of, wait_for  # noqa: F401 - tests written against this module import them here

# A context variable captured at enqueue (configured by the context-propagation tests).
request_id: ContextVar[str] = ContextVar("request_id")
REQUEST_ID_VAR = f"{__name__}:request_id"

RUNS_DDL = (
    "CREATE TABLE IF NOT EXISTS test_runtime_runs "
    "(job_id bigint, attempt int, pid int, note text, at timestamptz DEFAULT clock_timestamp())"
)
# No unique constraint on purpose: a duplicated effect must show as two rows.
EFFECTS_DDL = "CREATE TABLE IF NOT EXISTS test_effects (job_id bigint, attempt int, pid int)"

_local = threading.local()


def log_run(ctx: JobContext, note: str) -> None:
    """Record one execution outside the job's transaction (autocommit), so every run shows, even a killed one."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    conn.execute("INSERT INTO test_runtime_runs (job_id, attempt, pid, note) VALUES (%s, %s, %s, %s)",
                 (ctx.job_id, ctx.attempt, os.getpid(), note))


@consumer("kill_effects", lease_s=1.0)
def write_effect_then_hang_on_first_attempt(payload: dict, ctx: JobContext) -> None:
    """Writes its effect in ctx.transaction(); the first attempt hangs inside it (to be SIGKILLed)."""
    log_run(ctx, "started")
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO test_effects (job_id, attempt, pid) VALUES (%s, %s, %s)",
                     (ctx.job_id, ctx.attempt, os.getpid()))
        if ctx.attempt == 1:
            time.sleep(120)


@consumer("kill_plain", lease_s=1.0)
def hang_on_first_attempt(payload: dict, ctx: JobContext) -> None:
    """The first attempt hangs (to be SIGKILLed); later attempts return at once."""
    log_run(ctx, "started")
    if ctx.attempt == 1:
        time.sleep(120)
    log_run(ctx, "finished")


@pytest.fixture(autouse=True)
def isolated_registry():
    """Consumers registered by a test (and their enqueue hooks) are forgotten after it."""
    saved = default_registry.copy()
    yield
    default_registry.restore(saved)

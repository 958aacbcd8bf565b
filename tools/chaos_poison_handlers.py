"""Handlers of `python -m tools chaos --scenario poison` (workers import this with `--handlers`).

Imported only by the scenario (its workers, and its own process for the constants below), never by
tools/chaos.py at import: its queues must appear in no other worker (and the product never imports tools).

Two queues served by the same workers, so that hostile outcomes land in the completer's batches next to
ordinary ones: chaos-poison-ok (ordinary jobs: the effect in chaos_effects, written in the job's own
transaction as in the default scenario, and a small result) and chaos-poison (each job returns or raises the
hostile value its payload's "kind" names, with max_attempts=2 so that it ends dead quickly). Every run of a
poisoned handler is recorded first, in chaos_poison_runs (autocommit, on the handler thread's own
connection), so the check can count runs per attempt.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from outboxq.workers import JobContext, consumer
from tools.chaos_handlers import CHAOS_LEASE_S, OPTIONS, write_effect

OK_QUEUE, POISON_QUEUE = "chaos-poison-ok", "chaos-poison"
POISON_MAX_ATTEMPTS = 2
HUGE_RESULT_BYTES = 3 * 1024 * 1024  # over the 1 MiB default of max_result_bytes
HUGE_ERROR_BYTES = 1024 * 1024  # over the 64 KiB default of max_error_bytes
DEEP_LEVELS = 10_000  # past json.dumps's recursion limit (RecursionError, neither TypeError nor ValueError)
RUNS_DDL = """
CREATE TABLE IF NOT EXISTS chaos_poison_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    attempt int NOT NULL,
    kind text NOT NULL,
    pid int NOT NULL,
    ran_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


class UnprintableError(Exception):
    """An exception whose message cannot be made: str(exc) (and f"{exc}") raises."""

    def __str__(self) -> str:
        raise RuntimeError("chaos: this exception refuses to be printed")


def _deep() -> list:
    """DEEP_LEVELS nested lists, built without recursion (only serialising them recurses)."""
    value: list = []
    for _ in range(DEEP_LEVELS):
        value = [value]
    return value


def _raise(exc: BaseException) -> Any:
    raise exc


# kind -> what the handler does: returns the hostile value, or raises. Kept in one table so that the producer
# cycles through every kind.
POISONS: dict[str, Callable[[], Any]] = {
    "result_nul": lambda: {"s": "a\x00b"},  # json.dumps gives "\u0000", which jsonb refuses
    "error_nul": lambda: _raise(ValueError("bad\x00value")),  # text columns refuse NUL
    "result_nan": lambda: {"x": float("nan")},
    "result_infinity": lambda: {"x": float("inf"), "y": float("-inf")},
    "result_object": lambda: {"o": object()},
    "result_set": lambda: {1, 2, 3},
    "result_bytes": lambda: b"\x00\xffbytes",
    "result_surrogate": lambda: {"s": "\ud800"},  # "\ud800" escaped: jsonb refuses a lone surrogate
    "error_surrogate": lambda: _raise(ValueError("bad \ud800 value")),  # not encodable as UTF-8
    "result_huge": lambda: {"blob": "x" * HUGE_RESULT_BYTES},
    "error_huge": lambda: _raise(ValueError("e" * HUGE_ERROR_BYTES)),
    "result_deep": _deep,
    "error_unprintable": lambda: _raise(UnprintableError()),
}

_local = threading.local()


def _record_run(ctx: JobContext, kind: str) -> None:
    """Insert this run's row (autocommit, on this thread's connection, reconnecting once if it was cut)."""
    for attempt in (1, 2):
        conn = getattr(_local, "conn", None)
        try:
            if conn is None or conn.closed:
                conn = _local.conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
            conn.execute("INSERT INTO chaos_poison_runs (job_id, attempt, kind, pid) VALUES (%s, %s, %s, %s)",
                         (ctx.job_id, ctx.attempt, kind, os.getpid()))
            return
        except psycopg.OperationalError:
            if conn is not None:
                conn.close()
            if attempt == 2:
                raise


@consumer(OK_QUEUE, **OPTIONS)
def ordinary(payload: dict, ctx: JobContext) -> dict:
    """An ordinary job: its effect in its own transaction, and a small result (stored beside poisoned ones)."""
    write_effect(payload, ctx)
    return {"tag": payload["tag"]}


@consumer(POISON_QUEUE, backoff_base=0.1, backoff_max=0.5, lease_s=CHAOS_LEASE_S, max_attempts=POISON_MAX_ATTEMPTS)
def poisoned(payload: dict, ctx: JobContext) -> Any:
    """Record the run, then return or raise the hostile value of payload['kind']."""
    _record_run(ctx, payload["kind"])
    return POISONS[payload["kind"]]()

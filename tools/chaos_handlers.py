"""Handlers of the `python -m tools chaos` scenario: every effect is written with ctx.transaction().

The effects table has no unique constraint on purpose: a job whose effect committed twice would show as
two rows, which the scenario's check counts.
"""

from __future__ import annotations

import random
import time

from outboxq.workers import JobContext, consumer

EFFECTS_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS chaos_effects (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tag text NOT NULL,
    job_id bigint NOT NULL,
    queue text NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
CHAOS_LEASE_S = 3.0
OPTIONS = {"backoff_base": 0.2, "backoff_max": 2.0, "lease_s": CHAOS_LEASE_S, "max_attempts": 0}


def write_effect(payload: dict, ctx: JobContext) -> None:
    """Work a few milliseconds, then write the effect and complete the job in one transaction."""
    time.sleep(random.random() * payload.get("work_ms", 2) / 1000)
    import os

    with ctx.transaction() as conn:
        conn.execute(
            "INSERT INTO chaos_effects (tag, job_id, queue, attempt, pid) VALUES (%s, %s, %s, %s, %s)",
            (payload["tag"], ctx.job_id, ctx.queue, ctx.attempt, os.getpid()),
        )


@consumer("chaos-a", **OPTIONS)
def chaos_a(payload: dict, ctx: JobContext) -> None:
    """A plain job."""
    write_effect(payload, ctx)


@consumer("chaos-b", **OPTIONS)
def chaos_b(payload: dict, ctx: JobContext) -> None:
    """Fails its first attempt when the payload says so."""
    if payload.get("fail_first") and ctx.attempt == 1:
        raise RuntimeError("chaos: planned first-attempt failure")
    write_effect(payload, ctx)


@consumer("chaos-c", **OPTIONS)
def chaos_c(payload: dict, ctx: JobContext) -> None:
    """Depends on a chaos-a job (depends_on at enqueue)."""
    write_effect(payload, ctx)


@consumer("chaos-dead", backoff_base=0.1, backoff_max=0.2, lease_s=CHAOS_LEASE_S, max_attempts=1)
def chaos_dead(payload: dict, ctx: JobContext) -> None:
    """Always fails: these jobs are meant to end dead (one attempt, so rescues can still retry them)."""
    raise RuntimeError("chaos: this job is meant to die")

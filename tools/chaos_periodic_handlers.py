"""Handlers and schedules of `python -m tools chaos --scenario periodic` (workers import this with `--handlers`).

Three schedules feed one queue: every second with missed="all", every second with missed="skip", and a cron
schedule with a seconds field (every 2 s) with missed="latest". Each slot's job records its run in
chaos_periodic_runs with ctx.transaction(); the table has no unique constraint on purpose, so a slot whose
run committed twice shows as two rows.
"""

from __future__ import annotations

import os
from datetime import timedelta

from outboxq import JobContext, consumer, periodic
from tools.chaos_handlers import CHAOS_LEASE_S, OPTIONS

QUEUE = "chaos-tick"
RUNS_DDL = """
CREATE TABLE IF NOT EXISTS chaos_periodic_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key text NOT NULL,
    job_id bigint NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    ran_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

SCHEDULES = [
    periodic(QUEUE, every=timedelta(seconds=1), name="chaos-every-all", missed="all", payload={"s": "every-all"}),
    periodic(QUEUE, every=timedelta(seconds=1), name="chaos-every-skip", missed="skip",
             payload={"s": "every-skip"}),
    periodic(QUEUE, cron="*/2 * * * * *", name="chaos-cron-latest", missed="latest",
             payload={"s": "cron-latest"}),
]


@consumer(QUEUE, **OPTIONS)
def tick(payload: dict, ctx: JobContext) -> None:
    """Record this slot's run, in the job's own transaction (so it commits with the completion, once)."""
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO chaos_periodic_runs (key, job_id, attempt, pid) VALUES (%s, %s, %s, %s)",
                     (ctx.key, ctx.job_id, ctx.attempt, os.getpid()))


__all__ = ["CHAOS_LEASE_S", "QUEUE", "RUNS_DDL", "SCHEDULES"]

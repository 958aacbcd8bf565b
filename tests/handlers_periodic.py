"""Periodic schedules for the scheduler tests (subprocess workers import this with `--handlers`).

Three schedules on one queue, one per `missed` policy, every second. The handler records its job's slot in
test_periodic_runs inside ctx.transaction(), so a run counts once even when a killed worker's job is rescued.
"""

from __future__ import annotations

from datetime import timedelta

from outboxq import JobContext, consumer, periodic

RUNS_DDL = ("CREATE TABLE IF NOT EXISTS test_periodic_runs (key text PRIMARY KEY, job_id bigint, "
            "ran_at timestamptz DEFAULT clock_timestamp())")

for policy in ("latest", "skip", "all"):
    periodic("ticks", every=timedelta(seconds=1), name=f"every-second-{policy}", missed=policy,
             payload={"policy": policy})


@consumer("ticks", lease_s=2)
def tick(payload: dict, ctx: JobContext) -> None:
    """Record the run of this slot's job, exactly once."""
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO test_periodic_runs (key, job_id) VALUES (%s, %s)", (ctx.key, ctx.job_id))

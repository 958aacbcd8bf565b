"""What one job costs the PostgreSQL primary (issue 17, docs/scaling.md): WAL bytes, commits and row versions
per job, for each way in and out, counted by PostgreSQL itself (pg_current_wal_lsn, pg_stat_database,
pg_stat_user_tables) around each step. Counts, not timings: the figures do not depend on the machine's load.

    python bench/per_job_cost.py [postgresql://root@127.0.0.1:5432/root] [jobs, default 20000]

Makes (and drops first) the database outboxq_jobcost on that server.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import psycopg
from bench_db import drain_seconds, fresh_database

from outboxq import enqueue, enqueue_many

ADMIN = sys.argv[1] if len(sys.argv) > 1 else "postgresql://root@127.0.0.1:5432/root"
JOBS = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000

COUNTERS = """
SELECT pg_current_wal_lsn() AS lsn,
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits,
       (SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE relname = 'outboxq_jobs') AS rows,
       (SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'outboxq_jobs') AS hot
"""


def measure(url: str, step: Callable[[], None]) -> dict[str, float]:
    """WAL bytes, commits, row writes and HOT updates of the database during `step`."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        before = conn.execute(COUNTERS).fetchone()
        step()
        conn.execute("SELECT pg_sleep(1.2)")  # the backends report their statistics at most once a second
        conn.execute("SELECT pg_stat_clear_snapshot()")
        after = conn.execute(COUNTERS).fetchone()
        wal = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (after[0], before[0])).fetchone()[0]
    return {"wal_bytes": float(wal), "commits": after[1] - before[1], "row_writes": after[2] - before[2],
            "hot_updates": after[3] - before[3]}


def main() -> None:
    url = fresh_database(ADMIN, "outboxq_jobcost")

    def enqueue_batches() -> None:
        with psycopg.connect(url) as conn:
            for start in range(0, JOBS, 1_000):
                enqueue_many(conn, "cost", [{"n": i} for i in range(start, min(JOBS, start + 1_000))])
                conn.commit()

    def enqueue_singles() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            for i in range(JOBS // 10):
                enqueue(conn, "cost_single", {"n": i})

    def drain() -> None:
        drain_seconds(url, ["cost", "cost_single"], run_maintenance=False)

    rows = [("enqueue_many, 1,000 per transaction", JOBS, measure(url, enqueue_batches)),
            ("enqueue, one per transaction", JOBS // 10, measure(url, enqueue_singles)),
            ("claim + complete (one worker, defaults)", JOBS + JOBS // 10, measure(url, drain))]
    print(f"per job, {JOBS:,} jobs (PostgreSQL's own counters)")
    print("| step | WAL bytes | commits | row versions written | of which HOT updates |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, n, m in rows:
        print(f"| {name} | {m['wal_bytes'] / n:,.0f} | {m['commits'] / n:.3f} | {m['row_writes'] / n:.2f} | "
              f"{m['hot_updates'] / n:.2f} |")


if __name__ == "__main__":
    main()

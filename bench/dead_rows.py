"""Issue 17, dead rows: a drain of N no-op jobs while another session keeps a transaction (and so its
snapshot's xmin) open for the whole drain, against the same drain without it; jobs/s of each and their ratio.
While the old snapshot is held, vacuum cannot remove the dead row versions every claim and completion
leave behind, and the claims read through them.

    python bench/dead_rows.py [postgresql://root@127.0.0.1:5432/root] [jobs, default 500000]

Makes (and drops first) the database outboxq_deadrows on that server.
"""

from __future__ import annotations

import sys

import psycopg
from bench_db import drain_seconds, fresh_database

from outboxq import enqueue_many

ADMIN = sys.argv[1] if len(sys.argv) > 1 else "postgresql://root@127.0.0.1:5432/root"
JOBS = int(sys.argv[2]) if len(sys.argv) > 2 else 500_000


def drain(hold_xmin: bool) -> float:
    """Jobs/s of one worker draining JOBS no-op jobs, with or without an open transaction beside it."""
    url = fresh_database(ADMIN, "outboxq_deadrows")
    with psycopg.connect(url) as conn:
        for start in range(0, JOBS, 10_000):
            enqueue_many(conn, "dead_rows", [{}] * min(10_000, JOBS - start))
            conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE outboxq_jobs")
    holder = psycopg.connect(url)
    if hold_xmin:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM outboxq_queues").fetchone()  # takes the snapshot, keeps it
    try:
        return JOBS / drain_seconds(url, ["dead_rows"])
    finally:
        holder.close()


if __name__ == "__main__":
    free = drain(hold_xmin=False)
    held = drain(hold_xmin=True)
    print(f"drain of {JOBS:,}: {free:,.0f} jobs/s; with a transaction open throughout: {held:,.0f} jobs/s; "
          f"ratio {held / free:.2f}")

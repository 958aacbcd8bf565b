"""Issue 17, dead rows: a drain of N no-op jobs while another session keeps a transaction (and so its
snapshot's xmin) open for the whole drain, against the same drain without it; jobs/s of each and their ratio.
While the old snapshot is held, vacuum cannot remove the dead row versions every claim and completion
leave behind, and the claims read through them.

    python bench/dead_rows.py [postgresql://root@127.0.0.1:5432/root] [jobs, default 500000]

Makes (and drops first) the database outboxq_deadrows on that server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg

from outboxq import enqueue_many
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker

ADMIN = sys.argv[1] if len(sys.argv) > 1 else "postgresql://root@127.0.0.1:5432/root"
JOBS = int(sys.argv[2]) if len(sys.argv) > 2 else 500_000
DATABASE = "outboxq_deadrows"


def fresh_database() -> str:
    """A new migrated database with JOBS queued no-op jobs; its URL."""
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    url = ADMIN.rsplit("/", 1)[0] + "/" + DATABASE
    subprocess.run([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "migrate"],
                   env={**os.environ, "DATABASE_URL": url}, check=True, capture_output=True)
    with psycopg.connect(url) as conn:
        for start in range(0, JOBS, 10_000):
            enqueue_many(conn, "dead_rows", [{}] * min(10_000, JOBS - start))
            conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE outboxq_jobs")
    return url


def drain(hold_xmin: bool) -> float:
    """Jobs/s of one worker draining the queue, with or without an open transaction beside it."""
    url = fresh_database()
    holder = psycopg.connect(url)
    if hold_xmin:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM outboxq_queues").fetchone()  # takes the snapshot, keeps it
    worker = Worker([Consumer("dead_rows", lambda payload: None)], url=url)
    started = time.perf_counter()
    worker.start()
    with psycopg.connect(url, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM outboxq_jobs WHERE status <> 'done'").fetchone()[0]:
            time.sleep(0.2)
    elapsed = time.perf_counter() - started
    worker.stop(timeout=5)
    holder.close()
    return JOBS / elapsed


if __name__ == "__main__":
    free = drain(hold_xmin=False)
    held = drain(hold_xmin=True)
    print(f"drain of {JOBS:,}: {free:,.0f} jobs/s; with a transaction open throughout: {held:,.0f} jobs/s; "
          f"ratio {held / free:.2f}")

"""Does each process of `outboxq worker --processes N` share the drain? Each round fills a fresh database with
no-op jobs, starts `outboxq worker` afresh (as a user, or a peer harness, does), waits until every job is done
and prints, per worker process: when it started its first job and its last (from the first job of the round),
how many jobs it ran, and the round's rate timed from the first job started to the last one finished.

    python bench/drain_skew.py [URL of a server, default postgresql://root@127.0.0.1:5432/root] [rounds, default 6]
        [jobs, default 50000] [processes, default 2]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from bench_db import fresh_database

from outboxq import enqueue_many

ADMIN = sys.argv[1] if len(sys.argv) > 1 else "postgresql://root@127.0.0.1:5432/root"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
JOBS = int(sys.argv[3]) if len(sys.argv) > 3 else 50_000
PROCESSES = int(sys.argv[4]) if len(sys.argv) > 4 else 2
HERE = Path(__file__).resolve().parent


def checkpoints() -> int:
    """Checkpoints the server has begun so far (timed and requested): one during a drain slows its writes."""
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        if conn.info.server_version >= 170000:  # (PostgreSQL 17 moved them to a view of their own)
            query = "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
        else:
            query = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
        return int(conn.execute(query).fetchone()[0])


def one_round(number: int) -> None:
    url = fresh_database(ADMIN, "outboxq_drainskew")
    with psycopg.connect(url, autocommit=True) as conn:
        for start in range(0, JOBS, 10_000):
            with conn.transaction():
                enqueue_many(conn, "skew", [{}] * min(10_000, JOBS - start))
        conn.execute("VACUUM ANALYZE outboxq_jobs")
    checkpoints_before = checkpoints()
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(HERE)}
    launched = time.time()
    worker = subprocess.Popen([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "worker",
                               "--processes", str(PROCESSES), "--handlers", "drain_skew_handlers"],
                              env=env, cwd=HERE)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM outboxq_jobs WHERE status <> 'done'").fetchone()[0]:
                time.sleep(0.05)
            rows = conn.execute("""
                SELECT worker_id, count(*), extract(epoch FROM min(attempt_started_at)) AS first,
                       extract(epoch FROM max(finished_at)) AS last
                FROM outboxq_jobs GROUP BY worker_id ORDER BY first""").fetchall()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    checkpoints_during = checkpoints() - checkpoints_before
    time.sleep(1.0)  # (the statistics' counters reach the views within a second)
    with psycopg.connect(url, autocommit=True) as conn:
        vacuums, analyzes = conn.execute("SELECT autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
                                         "WHERE relname = 'outboxq_jobs'").fetchone()
    first = min(float(r[2]) for r in rows)
    last = max(float(r[3]) for r in rows)
    print(f"round {number}: {JOBS / (last - first):,.0f} jobs/s from the first job started to the last finished; "
          f"first job {first - launched:.2f} s after the launch; checkpoints begun meanwhile: {checkpoints_during}; "
          f"autovacuums of the jobs {vacuums}, autoanalyzes {analyzes}")
    for worker_id, count, started, finished in rows:
        print(f"    {worker_id:>40}  {count:>7,} jobs  first at +{float(started) - first:5.2f} s  "
              f"last at +{float(finished) - first:5.2f} s")


if __name__ == "__main__":
    for n in range(1, ROUNDS + 1):
        one_round(n)

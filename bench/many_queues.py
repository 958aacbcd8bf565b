"""Issue 17, many queues: 50 queues x 1,000 no-op jobs against 1 queue x 50,000, drained by one in-process
Worker with the default settings (claims are per queue); jobs/s of each and their ratio, two rounds.

    python bench/many_queues.py [postgresql://root@127.0.0.1:5432/root]

Makes (and drops first) the database outboxq_manyq on that server.
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
DATABASE = "outboxq_manyq"


def fresh_database() -> str:
    """A new migrated database; its URL."""
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    url = ADMIN.rsplit("/", 1)[0] + "/" + DATABASE
    subprocess.run([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "migrate"],
                   env={**os.environ, "DATABASE_URL": url}, check=True, capture_output=True)
    return url


def drain(queues: list[str], per_queue: int) -> float:
    """Jobs/s of one worker draining `per_queue` no-op jobs in each of `queues`."""
    url = fresh_database()
    with psycopg.connect(url) as conn:
        for queue in queues:
            enqueue_many(conn, queue, [{}] * per_queue)
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE outboxq_jobs")
    worker = Worker([Consumer(q, lambda payload: None) for q in queues], url=url, run_maintenance=False)
    started = time.perf_counter()
    worker.start()
    with psycopg.connect(url, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM outboxq_jobs WHERE status <> 'done'").fetchone()[0]:
            time.sleep(0.05)
    elapsed = time.perf_counter() - started
    worker.stop(timeout=5)
    return len(queues) * per_queue / elapsed


if __name__ == "__main__":
    for round_number in range(2):
        one = drain(["single"], 50_000)
        many = drain([f"q{i}" for i in range(50)], 1_000)
        print(f"round {round_number}: 1 queue x 50,000: {one:,.0f} jobs/s; 50 queues x 1,000: {many:,.0f} jobs/s;"
              f" ratio {many / one:.2f}")

"""Issue 17, many queues: 50 queues x 1,000 no-op jobs against 1 queue x 50,000, drained by one in-process
Worker with the default settings (claims are per queue); jobs/s of each and their ratio, two rounds.

    python bench/many_queues.py [postgresql://root@127.0.0.1:5432/root] [jobs per queue, default 1000]

Makes (and drops first) the database outboxq_manyq on that server.
"""

from __future__ import annotations

import sys

import psycopg
from bench_db import drain_seconds, fresh_database

from outboxq import enqueue_many

ADMIN = sys.argv[1] if len(sys.argv) > 1 else "postgresql://root@127.0.0.1:5432/root"
PER_QUEUE = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000


def drain(queues: list[str], per_queue: int) -> float:
    """Jobs/s of one worker draining `per_queue` no-op jobs in each of `queues`."""
    url = fresh_database(ADMIN, "outboxq_manyq")
    with psycopg.connect(url) as conn:
        for queue in queues:
            enqueue_many(conn, queue, [{}] * per_queue)
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE outboxq_jobs")
    return len(queues) * per_queue / drain_seconds(url, queues, run_maintenance=False)


if __name__ == "__main__":
    for round_number in range(2):
        one = drain(["single"], 50 * PER_QUEUE)
        many = drain([f"q{i}" for i in range(50)], PER_QUEUE)
        print(f"round {round_number}: 1 queue x {50 * PER_QUEUE:,}: {one:,.0f} jobs/s; 50 queues x {PER_QUEUE:,}: "
              f"{many:,.0f} jobs/s; ratio {many / one:.2f}")

"""Latency of the operators' routes' queries beside a large history: the search across queues with each kind of
filter (one that matches nothing too), the live workers and the workflows listing, medians of 5 runs.

    python bench/operations_latency.py [postgresql://root@127.0.0.1:5432/root] [finished jobs, default 300000]

Writes that many finished jobs (a tenth dead, with errors) and 20,000 waiting ones into the database
outboxq_opslat (dropped first), then times each call through the same functions the routes call.
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

import psycopg
from bench_db import fresh_database

from outboxq.queue import admin, search
from outboxq.queue.workflows import list_workflows

ADMIN = sys.argv[1] if len(sys.argv) > 1 else "postgresql://root@127.0.0.1:5432/root"
HISTORY = int(sys.argv[2]) if len(sys.argv) > 2 else 300_000


def fill(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO outboxq_jobs (queue, key, status, payload, finished_at, last_error, created_at)
            SELECT 'q' || (i %% 20), 'order-' || i, CASE WHEN i %% 10 = 0 THEN 'dead' ELSE 'done' END,
                   jsonb_build_object('customer', 'c' || (i %% 1000), 'n', i), now(),
                   CASE WHEN i %% 10 = 0 THEN 'ConnectionError: downstream ' || (i %% 7) END,
                   now() - (%(n)s - i) * interval '1 second'
            FROM generate_series(1, %(n)s) AS i""", {"n": HISTORY})
        conn.execute("""
            INSERT INTO outboxq_jobs (queue, status, payload)
            SELECT 'q' || (i % 20), 'waiting', jsonb_build_object('customer', 'c' || (i % 1000))
            FROM generate_series(1, 20000) AS i""")
        conn.execute("VACUUM ANALYZE")


def timed(url: str, call) -> float:
    samples = []
    with psycopg.connect(url) as conn:
        for _ in range(5):
            started = time.perf_counter()
            call(conn)
            samples.append(time.perf_counter() - started)
            conn.rollback()
    return statistics.median(samples) * 1000


if __name__ == "__main__":
    database = fresh_database(ADMIN, "outboxq_opslat")
    fill(database)
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    cases = {
        "search, no filter": search.JobFilter(),
        "search, queue + status dead": search.JobFilter(queue="q3", statuses=("dead",)),
        "search, status waiting": search.JobFilter(statuses=("waiting",)),
        "search, key prefix": search.JobFilter(key="order-12"),
        "search, payload contains": search.JobFilter(payload={"customer": "c42"}),
        "search, error text": search.JobFilter(error="downstream 3"),
        "search, since an hour": search.JobFilter(since=hour_ago),
        "search, matches nothing": search.JobFilter(queue="q3", statuses=("running",)),
        "search, every field": search.JobFilter(queue="q0", statuses=("dead",), key="order-", payload={"n": 100},
                                               error="downstream", since=hour_ago - timedelta(days=30)),
    }
    print(f"beside {HISTORY:,} finished jobs and 20,000 waiting (median of 5, ms):")
    for name, job_filter in cases.items():
        print(f"  {name:34} {timed(database, lambda c, f=job_filter: search.search_jobs(c, f, limit=50)):8.1f}")
    print(f"  {'bulk retry, filter matches nothing':34} "
          f"{timed(database, lambda c: search.bulk_retry(c, job_filter=search.JobFilter(queue='none'))):8.1f}")
    print(f"  {'count, queue + status dead':34} "
          f"{timed(database, lambda c: search.count_jobs(c, cases['search, queue + status dead'])):8.1f}")
    print(f"  {'count, no filter (capped)':34} {timed(database, lambda c: search.count_jobs(c, search.JobFilter())):8.1f}")
    # The dashboard's overview and a queue's page: every finished job is within the day here (the worst case).
    print(f"  {'queues listing (a day finished)':34} {timed(database, admin.queue_counts):8.1f}")
    print(f"  {'one queue':34} {timed(database, lambda c: admin.queue_counts(c, 'q3')):8.1f}")
    print(f"  {'throughput, an hour':34} {timed(database, admin.throughput):8.1f}")
    print(f"  {'processing time, a queue, a day':34} "
          f"{timed(database, lambda c: admin.processing_time_stats(c, queue='q3')):8.1f}")
    print(f"  {'retries, a queue, a day':34} {timed(database, lambda c: admin.retry_stats(c, queue='q3')):8.1f}")
    print(f"  {'live workers':34} {timed(database, admin.live_workers):8.1f}")
    print(f"  {'workflows listing':34} {timed(database, list_workflows):8.1f}")

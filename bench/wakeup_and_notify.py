"""Enqueue throughput with and without its NOTIFY, and the wake-up latency of an idle worker.

    python bench/wakeup_and_notify.py [--url postgresql://root@127.0.0.1:5432/postgres]
                                      [--jobs 3000] [--samples 200] [--connections 1,4]

Works in a scratch database (created, migrated, dropped) on the server of --url (default: DATABASE_URL,
else the embedded PostgreSQL).

- throughput: `enqueue` of one job + COMMIT per job, on `c` connections in parallel, with its INSERT's
  notification (sql.jobs.NOTIFY_IF_READY), then with that expression replaced by NULL (in this process only);
- latency: an idle Worker (poll_interval=30 s, so only NOTIFY can wake it) and `samples` jobs enqueued one
  at a time; latency = enqueue+commit start -> handler start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from outboxq import enqueue  # noqa: E402
from outboxq.db import database_url, url_with_database  # noqa: E402
from outboxq.queue import migrate, sql  # noqa: E402
from outboxq.workers.registry import Consumer  # noqa: E402
from outboxq.workers.runner import Worker  # noqa: E402

JOB_INSERT = sql.job_insert


def throughput(url: str, jobs: int, connections: int) -> float:
    """Jobs per second for `jobs` single-job transactions spread over `connections` connections."""
    per_conn = jobs // connections
    barrier = threading.Barrier(connections + 1)

    def run() -> None:
        with psycopg.connect(url) as conn:
            barrier.wait()
            for i in range(per_conn):
                enqueue(conn, "bench", {"i": i})
                conn.commit()

    threads = [threading.Thread(target=run) for _ in range(connections)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return per_conn * connections / (time.perf_counter() - start)


def set_notify(url: str, enabled: bool) -> None:
    """enqueue's INSERT with its notification, or (this process only, for the measure) without it; an empty
    table either way."""
    sql.job_insert = JOB_INSERT if enabled else JOB_INSERT.replace(sql.NOTIFY_IF_READY, "NULL")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE outboxq_jobs CASCADE")
        conn.execute("VACUUM ANALYZE outboxq_jobs")


def wakeup_latencies(url: str, samples: int) -> list[float]:
    """Seconds from enqueue+commit to handler start, for an idle worker woken only by NOTIFY."""
    started: dict[int, float] = {}
    arrived = threading.Event()

    def handler(payload, ctx):
        started[payload["i"]] = time.perf_counter()
        arrived.set()

    worker = Worker([Consumer("wake", handler)], url=url, poll_interval=30.0, concurrency=4).start()
    latencies = []
    try:
        if worker.listener is None or not worker.listener.ready.wait(10):
            raise RuntimeError("the worker's listener did not start")
        time.sleep(0.3)
        with psycopg.connect(url) as conn:
            for i in range(samples):
                time.sleep(0.02)  # the worker is idle again
                arrived.clear()
                t0 = time.perf_counter()
                enqueue(conn, "wake", {"i": i})
                conn.commit()
                if not arrived.wait(35):
                    raise RuntimeError(f"sample {i} never ran")
                latencies.append(started[i] - t0)
    finally:
        worker.stop(timeout=5)
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--connections", default="1,4")
    args = parser.parse_args()

    server = args.url or os.environ.get("DATABASE_URL") or database_url()
    name = f"outboxq_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = url_with_database(server, name)
    try:
        migrate.upgrade(url)
        with psycopg.connect(url) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        print(f"PostgreSQL {version}, synchronous_commit={sync}, {args.jobs} jobs, one enqueue+commit per job")
        for connections in [int(c) for c in args.connections.split(",")]:
            rates = {}
            for enabled in (True, False, True, False):  # interleaved, best of two each
                set_notify(url, enabled)
                rate = throughput(url, args.jobs, connections)
                rates[enabled] = max(rates.get(enabled, 0.0), rate)
            on, off = rates[True], rates[False]
            print(f"  {connections} connection(s): with NOTIFY {on:7.0f} jobs/s, "
                  f"without {off:7.0f} jobs/s  (notify costs {100 * (off - on) / off:4.1f} %)")
        set_notify(url, True)
        latencies = [x * 1000 for x in wakeup_latencies(url, args.samples)]
        print(f"wake-up latency, idle worker (poll_interval 30 s), {len(latencies)} samples, ms: "
              f"p50 {statistics.median(latencies):.2f}  p90 {percentile(latencies, 0.90):.2f}  "
              f"p99 {percentile(latencies, 0.99):.2f}  max {max(latencies):.2f}")
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())

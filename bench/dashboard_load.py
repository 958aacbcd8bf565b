"""What open dashboards cost the database: N tabs, each reading the overview (queues, health, throughput: what
the dashboard's live update reads every 2 s) for a while, beside a history of finished jobs; the PostgreSQL
server's CPU (every postgres process's, read with psutil) per second of the run, and the requests' latency.

    python bench/dashboard_load.py [URL] [tabs, default 10] [seconds, default 30] [finished jobs, default 300000]

Makes (and drops first) the database outboxq_dashload with that many finished jobs, all within the last day
(the worst case for the overview's counts, which cover a day), and 20,000 waiting ones.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

import httpx
import psutil
import psycopg
from bench_db import ROOT, fresh_database

from tools.bench_http import api_process, free_port

ADMIN = sys.argv[1] if len(sys.argv) > 1 else "postgresql://root@127.0.0.1:5432/root"
TABS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
TOKEN = "dashboard-load-admin-token"
OVERVIEW = ("/v1/queues", "/v1/health", "/v1/stats/throughput?minutes=60")
EVERY_S = 2.0
HISTORY = int(sys.argv[4]) if len(sys.argv) > 4 else 300_000


def postgres_cpu_s() -> float:
    """CPU seconds used so far by every PostgreSQL server process of this machine."""
    total = 0.0
    for process in psutil.process_iter(["name", "cpu_times"]):
        if process.info["name"] and process.info["name"].startswith("postgres") and process.info["cpu_times"]:
            total += process.info["cpu_times"].user + process.info["cpu_times"].system
    return total


def tab(base: str, stop: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
        while not stop.is_set():
            started = time.perf_counter()
            for path in OVERVIEW:
                client.get(path).raise_for_status()
            latencies.append(time.perf_counter() - started)
            stop.wait(max(0.0, EVERY_S - (time.perf_counter() - started)))


if __name__ == "__main__":
    url = fresh_database(ADMIN, "outboxq_dashload")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("""INSERT INTO outboxq_jobs (queue, status, payload, finished_at)
                        SELECT 'q' || (i %% 20), CASE WHEN i %% 10 = 0 THEN 'dead' ELSE 'done' END, '{}'::jsonb,
                               now() - (i %% 86400) * interval '1 second'
                        FROM generate_series(1, %s) AS i""", (HISTORY,))
        conn.execute("""INSERT INTO outboxq_jobs (queue, status, payload)
                        SELECT 'q' || (i % 20), 'waiting', '{}'::jsonb FROM generate_series(1, 20000) AS i""")
        conn.execute("VACUUM ANALYZE")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DATABASE_URL": url, "OUTBOXQ_API_TOKENS": f"{TOKEN}:admin"}
    with api_process([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "serve", "--host", "127.0.0.1",
                      "--port", str(port)], env, base, ROOT):
        stop, latencies = threading.Event(), []
        tabs = [threading.Thread(target=tab, args=(base, stop, latencies)) for _ in range(TABS)]
        cpu_before, started = postgres_cpu_s(), time.perf_counter()
        for t in tabs:
            t.start()
        time.sleep(SECONDS)
        stop.set()
        for t in tabs:
            t.join()
        elapsed, cpu = time.perf_counter() - started, postgres_cpu_s() - cpu_before
    print(f"{TABS} dashboards reading the overview every {EVERY_S:g} s for {elapsed:.0f} s, beside {HISTORY:,} finished "
          f"and 20,000 waiting jobs: {len(latencies)} refreshes ({3 * len(latencies) / elapsed:.1f} requests/s); "
          f"PostgreSQL used {cpu:.2f} CPU s = {100 * cpu / elapsed:.1f}% of one core; a refresh took "
          f"{statistics.median(latencies) * 1000:.1f} ms (median), {max(latencies) * 1000:.1f} ms (max)")

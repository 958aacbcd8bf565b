"""Bounded HTTP load test: `outboxq serve` in one process, this script's threads loading it from another.

    python bench/http_load.py --seconds 120 --threads 8 [--database-url postgresql://...] [--batch 0]

It creates a scratch database (on --database-url's server, else an embedded one), starts the API on a
free loopback port, sends POST /v1/queues/load/jobs (or /batch with --batch N) for the given time, then
prints requests/s, jobs/s, p50/p99 latency and errors, and checks that every acknowledged job is stored
exactly once (zero lost). Exit 0 only with zero errors and zero lost jobs.
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

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_db import scratch_database, server_or_embedded  # noqa: E402

from tools.bench_http import api_process, free_port  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=0, help="jobs per request via /batch (0: one job per request)")
    parser.add_argument("--database-url")
    args = parser.parse_args()

    server_url = server_or_embedded(args.database_url, "outboxq-load-")
    port, token = free_port(), uuid.uuid4().hex
    base = f"http://127.0.0.1:{port}"
    with scratch_database(server_url, "outboxq_load") as url:
        env = {**os.environ, "DATABASE_URL": url, "OUTBOXQ_API_TOKENS": f"{token}:admin", "PYTHONPATH": str(ROOT),
               "OUTBOXQ_DB_POOL_MAX": str(max(4, args.threads))}
        command = [sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "serve", "--host", "127.0.0.1",
                   "--port", str(port)]
        with api_process(command, env, base, ROOT):
            return load(args, base, token, url)


def load(args: argparse.Namespace, base: str, token: str, url: str) -> int:
    """Load the API for args.seconds from args.threads threads; print the figures; 0 when nothing failed."""
    latencies: list[float] = []
    errors: list[str] = []
    acknowledged = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + args.seconds

    def one_thread() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        mine: list[float] = []
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            while time.monotonic() < stop_at:
                if args.batch:
                    path, body = "/v1/queues/load/jobs/batch", {"jobs": [{"payload": {"i": i}} for i in range(args.batch)]}
                else:
                    path, body = "/v1/queues/load/jobs", {"payload": {"n": 1}}
                started = time.perf_counter()
                try:
                    r = client.post(path, json=body)
                    ok = r.status_code == 201
                except httpx.HTTPError as exc:
                    ok, r = False, exc
                mine.append(time.perf_counter() - started)
                with lock:
                    if ok:
                        acknowledged[0] += args.batch or 1
                    else:
                        errors.append(str(getattr(r, "status_code", r)))
        with lock:
            latencies.extend(mine)

    began = time.monotonic()
    threads = [threading.Thread(target=one_thread) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    with psycopg.connect(url) as conn:
        stored = conn.execute("SELECT count(*) FROM outboxq_jobs WHERE queue = 'load'").fetchone()[0]
    latencies.sort()
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    lost = acknowledged[0] - stored
    print(f"requests: {len(latencies)} in {elapsed:.1f} s = {len(latencies) / elapsed:.0f} req/s, "
          f"{acknowledged[0] / elapsed:.0f} jobs/s ({args.threads} threads, batch {args.batch or 1})")
    print(f"latency: p50 {p(0.50):.1f} ms, p99 {p(0.99):.1f} ms, mean {statistics.mean(latencies) * 1000:.1f} ms")
    print(f"errors: {len(errors)}; acknowledged jobs {acknowledged[0]}, stored {stored}, lost {lost}")
    return 0 if not errors and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

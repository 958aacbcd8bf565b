"""What a limited claim costs: EXPLAIN (ANALYZE, BUFFERS) of the unlimited claim, the limited claim
(global_concurrency=10000) and the per-key claim (limit_by, 10000 per key), at rest and in the middle of a
drain (after `--claims` claims of `--limit` jobs, each completed, no VACUUM in between: the dead index entries
of a real drain), with `--keys` distinct keys.

    python bench/flow_claim_explain.py [--url postgresql://root@127.0.0.1:5432/postgres]
                                       [--keys 100] [--jobs 20000] [--limit 500] [--claims 20] [--repeat 3]
                                       [--running 0] [--beside 0] [--max-keys N]

As in a drain: `--running 3` leaves the last three claims' jobs running (the jobs the workers hold, which every
limited claim counts); `--max-keys 25` scans as many keys as a drain's deep turns do (limit / 40) instead of
every key the claim may need. `--beside 20000`: that many running jobs of another queue (a limited claim's
count reads its own queue's part of the lease index since migration 0013).

Works in a scratch database (created, migrated, dropped) on the server of --url (default: DATABASE_URL,
else the embedded PostgreSQL). Each figure is the median of --repeat runs of EXPLAIN ANALYZE, each in a
transaction rolled back. `--generic`: the limited claims also as the worker runs them, prepared, under
plan_cache_mode=force_generic_plan (outboxq.queue.sql.limits.claim_generic_plan): one plan, made once.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from outboxq.db import database_url, url_with_database  # noqa: E402
from outboxq.queue import limits, migrate, sql  # noqa: E402
from outboxq.queue.sql import limits as limits_sql  # noqa: E402
from outboxq.workers.claim_cursor import FROM_THE_FRONT  # noqa: E402

CLAIMS = {"unlimited": sql.job_claim_batch, "global_concurrency": limits_sql.job_claim_limited,
          "per_key": limits_sql.job_claim_limited_per_key}


def fill(conn: psycopg.Connection, kind: str, keys: int, jobs: int, beside: int = 0) -> None:
    """`jobs` ready jobs in queue q (spread over `keys` limit keys for per_key), the queue's limits, `beside`
    running jobs of another queue (what a limited claim's count of its own running jobs must not read), VACUUM."""
    conn.execute("TRUNCATE outboxq_jobs CASCADE")
    conn.execute("DELETE FROM outboxq_queue_limits")
    conn.execute("INSERT INTO outboxq_jobs (queue, status, payload, limit_key) "
                 "SELECT 'q', 'queued', '{}'::jsonb, CASE WHEN %s THEN 'key-' || (g %% %s) END "
                 "FROM generate_series(1, %s) AS g", (kind == "per_key", keys, jobs))
    conn.execute("INSERT INTO outboxq_jobs (queue, status, payload, lease_token, lease_expires_at, attempts) "
                 "SELECT 'other', 'running', '{}'::jsonb, gen_random_uuid(), now() + interval '1 hour', 1 "
                 "FROM generate_series(1, %s)", (beside,))
    if kind != "unlimited":
        conn.execute("INSERT INTO outboxq_queue_limits (queue, global_concurrency, per_key) VALUES ('q', 10000, %s)",
                     (kind == "per_key",))
    conn.execute("VACUUM ANALYZE outboxq_jobs")


MAX_KEYS: int | None = None  # --max-keys: how many keys a per-key claim scans (None: key_budget(limit))


def params(limit: int, after_key: str) -> dict:
    """The claim's parameters, as the worker passes them."""
    max_keys = MAX_KEYS or limits.key_budget(limit)
    return {"queue": "q", "limit": limit, "lease_token": uuid.uuid4(), "lease_s": 30.0, "worker_id": "bench",
            "default_max_attempts": 5, **FROM_THE_FRONT, "after_key": after_key, "max_keys": max_keys,
            "reserve": 0}


@contextmanager
def scratch_database(server_url: str | None) -> Iterator[str]:
    """A new, migrated database on the server of `server_url` (default: DATABASE_URL, else the embedded
    PostgreSQL); its URL. Dropped afterwards."""
    server = server_url or os.environ.get("DATABASE_URL") or database_url()
    name = f"outboxq_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = url_with_database(server, name)
        migrate.upgrade(url)
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def explain(conn: psycopg.Connection, kind: str, limit: int, after_key: str, repeat: int) -> tuple[float, float, int]:
    """Median planning ms, execution ms and shared buffers hit of the claim (rolled back each time)."""
    planning, execution, buffers = [], [], []
    for _ in range(repeat):
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIMS[kind],
                            params(limit, after_key)).fetchone()["QUERY PLAN"][0]
        conn.rollback()
        planning.append(plan["Planning Time"])
        execution.append(plan["Execution Time"])
        buffers.append(plan["Plan"].get("Shared Hit Blocks", 0))
    return statistics.median(planning), statistics.median(execution), int(statistics.median(buffers))


def explain_generic(conn: psycopg.Connection, kind: str, limit: int, after_key: str,
                    repeat: int) -> tuple[float, float, int]:
    """As explain(), the claim prepared (placeholders $1, $2... in order of first use) and run with its generic
    plan, as a worker's prepared claim runs under limits_sql.claim_generic_plan."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", CLAIMS[kind])))  # psycopg's $1, $2... in this order
    planning, execution, buffers = [], [], []
    for _ in range(repeat):
        # Prepared with psycopg's parameter types, by a claim of no job, outside a transaction (psycopg
        # deallocates every statement when a transaction rolls back: prepared again for each run).
        conn.autocommit = True
        conn.execute(sql.session_generic_plans)  # (as limits_sql.claim_generic_plan, for the session)
        conn.execute(CLAIMS[kind], params(0, after_key), prepare=True)
        name = conn.execute("SELECT name FROM pg_prepared_statements WHERE starts_with(statement, %s)",
                            (CLAIMS[kind][:CLAIMS[kind].index("%")],)).fetchone()["name"]
        conn.autocommit = False
        values = params(limit, after_key)
        # (The values as literals: sent as parameters, EXECUTE's arguments would have no type.)
        plan = conn.execute(pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {}({})").format(
            pgsql.Identifier(name), pgsql.SQL(", ").join(pgsql.Literal(values[n]) for n in names)),
        ).fetchone()["QUERY PLAN"][0]
        conn.rollback()
        planning.append(plan.get("Planning Time", 0.0))
        execution.append(plan["Execution Time"])
        buffers.append(plan["Plan"].get("Shared Hit Blocks", 0))
    conn.autocommit = True
    conn.execute("RESET plan_cache_mode")
    conn.execute("RESET enable_seqscan")
    conn.autocommit = False
    return statistics.median(planning), statistics.median(execution), int(statistics.median(buffers))


def drain_some(conn: psycopg.Connection, kind: str, limit: int, claims: int, running: int = 0) -> str:
    """Claim and complete `claims` batches as a worker would, the last `running` of them left running (as the
    jobs that the workers hold in a drain); returns the per-key round robin's cursor."""
    after_key = ""
    for n in range(claims):
        if kind != "unlimited":
            conn.execute(limits_sql.queue_limit_claim_exclusive, {"queue": "q"})
        p = params(limit, after_key)
        rows = conn.execute(CLAIMS[kind], p).fetchall()
        conn.commit()
        if kind == "per_key" and rows:
            after_key = limits.round_robin(rows, after_key)[1]
        if n >= claims - running:
            continue
        conn.execute(sql.job_complete_batch, {"ids": [r["id"] for r in rows],
                                              "lease_tokens": [p["lease_token"]] * len(rows)}).fetchall()
        conn.commit()
    return after_key


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--claims", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--generic", action="store_true",
                        help="also the limited claims prepared, with their generic plan (as the worker runs them)")
    parser.add_argument("--plan", action="store_true", help="also print each claim's plan in the middle of the drain")
    parser.add_argument("--running", type=int, default=0,
                        help="how many of the --claims claims stay running (not completed), as in a drain")
    parser.add_argument("--beside", type=int, default=0,
                        help="running jobs of another queue beside the claimed one (their leases valid throughout)")
    parser.add_argument("--max-keys", type=int, default=None,
                        help="keys a per-key claim scans (default: every key it may need; a drain's deep turns "
                             "scan limit / 40)")
    args = parser.parse_args()
    global MAX_KEYS
    MAX_KEYS = args.max_keys

    with scratch_database(args.url) as url:
        print(f"{args.jobs:,} ready jobs, {args.keys:,} keys (per_key), claims of {args.limit}"
              + (f", {args.beside:,} running jobs of another queue beside them" if args.beside else ""))
        with psycopg.connect(url, row_factory=dict_row) as conn:
            for kind in CLAIMS:
                conn.autocommit = True
                fill(conn, kind, args.keys, args.jobs, args.beside)
                conn.autocommit = False
                at_rest = explain(conn, kind, args.limit, "", args.repeat)
                after_key = drain_some(conn, kind, args.limit, args.claims, args.running)
                mid = explain(conn, kind, args.limit, after_key, args.repeat)
                print(f"  {kind:18} at rest: planning {at_rest[0]:5.2f} ms, execution {at_rest[1]:6.2f} ms, "
                      f"{at_rest[2]:6,} buffers | after {args.claims} claims: planning {mid[0]:5.2f} ms, "
                      f"execution {mid[1]:6.2f} ms, {mid[2]:6,} buffers")
                if args.generic and kind != "unlimited":
                    generic = explain_generic(conn, kind, args.limit, after_key, args.repeat)
                    print(f"  {kind + ' generic':26} after {args.claims} claims: planning {generic[0]:5.2f} ms, "
                          f"execution {generic[1]:6.2f} ms, {generic[2]:6,} buffers")
                if args.plan:
                    rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + CLAIMS[kind],
                                        params(args.limit, after_key)).fetchall()
                    conn.rollback()
                    print("\n".join("      " + r["QUERY PLAN"] for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What workflows and sequences cost: a diamond's wall time against four plain jobs, a 1,000-step workflow's
write, a sequence's drain against a plain queue's, and the workflow detail and listing queries beside a history
of finished steps.

    python bench/workflow_cost.py [postgresql://root@127.0.0.1:5432/root] [finished steps, default 1000000]

One in-process Worker (no-op handlers, poll interval 1 s so that only notifications wake it). Makes (and
drops first) the database outboxq_wfcost on that server.
"""

from __future__ import annotations

import statistics
import sys
import time

import psycopg
from bench_db import drain_seconds, fresh_database

from outboxq import Workflow, enqueue, enqueue_many
from outboxq.queue import sql
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker

ADMIN = sys.argv[1] if len(sys.argv) > 1 else "postgresql://root@127.0.0.1:5432/root"
HISTORY = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
ROUNDS = 15
QUEUES = ("fetch", "left", "right", "join")


def _wait_done(conn: psycopg.Connection, ids: list[int]) -> None:
    while conn.execute("SELECT count(*) FROM outboxq_jobs WHERE id = ANY(%s) AND status <> 'done'",
                       (ids,)).fetchone()[0]:
        time.sleep(0.002)


def handoff(url: str) -> tuple[float, float]:
    """Median seconds from commit to the last job done: a diamond (fetch, then left and right, then join), and
    four plain jobs of the same queues enqueued together."""
    worker = Worker([Consumer(q, lambda payload, ctx: {"ok": True}) for q in QUEUES], url=url, poll_interval=1.0,
                    concurrency=4).start()
    diamonds, plains = [], []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(ROUNDS):
                wf = Workflow("bench")
                fetch = wf.step("fetch", queue="fetch")
                sides = [wf.step(n, queue=n, after=[fetch]) for n in ("left", "right")]
                wf.step("join", queue="join", after=sides)
                started = time.perf_counter()
                with conn.transaction():
                    workflow_id = wf.enqueue(conn)
                ids = [r[0] for r in conn.execute("SELECT id FROM outboxq_jobs WHERE workflow_id = %s",
                                                  (workflow_id,))]
                _wait_done(conn, ids)
                diamonds.append(time.perf_counter() - started)
                started = time.perf_counter()
                with conn.transaction():
                    ids = [enqueue(conn, q, {}).id for q in QUEUES]
                _wait_done(conn, ids)
                plains.append(time.perf_counter() - started)
    finally:
        worker.stop(timeout=5)
    return statistics.median(diamonds), statistics.median(plains)


def thousand_steps_written(url: str, runs: int = 5) -> tuple[float, float]:
    """Best and median seconds to write (and commit) one workflow of 1,000 steps: a root, 998 steps after it, a
    join after all of them."""
    samples = []
    with psycopg.connect(url) as conn:
        for _ in range(runs):
            wf = Workflow("thousand")
            root = wf.step("root", queue="fetch")
            middle = [wf.step(f"m{n}", queue="left", after=[root]) for n in range(998)]
            wf.step("join", queue="join", after=middle)
            started = time.perf_counter()
            wf.enqueue(conn)
            conn.commit()
            samples.append(time.perf_counter() - started)
    return min(samples), statistics.median(samples)


def sequence_drain(url: str, jobs: int = 2000, sequences: int = 10) -> tuple[float, float]:
    """Jobs/s of `jobs` no-op jobs in `sequences` sequences, and of as many plain jobs."""
    with psycopg.connect(url) as conn:
        for n in range(jobs):
            enqueue(conn, "seq", {}, sequence=f"s{n % sequences}")
        conn.commit()
    sequenced = jobs / drain_seconds(url, ["seq"], run_maintenance=False)
    with psycopg.connect(url) as conn:
        enqueue_many(conn, "plain", [{}] * jobs)
        conn.commit()
    plain = jobs / drain_seconds(url, ["plain"], run_maintenance=False)
    return sequenced, plain


def detail_queries(url: str, history: int) -> None:
    """Write `history` finished steps (workflows of 4), then EXPLAIN ANALYZE the detail and listing queries."""
    with psycopg.connect(url, autocommit=True) as conn:
        workflows = history // 4
        conn.execute("INSERT INTO outboxq_workflows (name, steps) SELECT 'w' || g, 4 FROM generate_series(1, %s) g",
                     (workflows,))
        conn.execute("""
            INSERT INTO outboxq_jobs (queue, status, payload, workflow_id, step, finished_at, result)
            SELECT 'hist', 'done', '{}'::jsonb, w.id, s.step, now(), '{"ok": true}'::jsonb
            FROM outboxq_workflows w, unnest(ARRAY['fetch', 'left', 'right', 'join']) AS s(step)
            WHERE w.name <> 'bench'""")
        conn.execute("""
            INSERT INTO outboxq_job_dependencies (job_id, depends_on_id)
            SELECT later.id, earlier.id FROM outboxq_jobs later JOIN outboxq_jobs earlier
              ON earlier.workflow_id = later.workflow_id AND later.queue = 'hist'
             AND ((later.step IN ('left', 'right') AND earlier.step = 'fetch')
                  OR (later.step = 'join' AND earlier.step IN ('left', 'right')))""")
        conn.execute("VACUUM ANALYZE")
        middle = conn.execute("SELECT id FROM outboxq_workflows ORDER BY id OFFSET %s LIMIT 1",
                              (workflows // 2,)).fetchone()[0]
        for name, statement, params in (("workflow_get", sql.workflow_get, {"id": middle}),
                                        ("workflow_steps", sql.workflow_steps, {"id": middle}),
                                        ("workflow_list", sql.workflow_list, {"limit": 50, "before": None})):
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, params).fetchall()
            print(f"--- {name} beside {history:,} finished steps")
            print("\n".join(r[0] for r in plan))


if __name__ == "__main__":
    database = fresh_database(ADMIN, "outboxq_wfcost")
    diamond, plain = handoff(database)
    print(f"hand-off: a diamond (4 steps, 3 levels) {diamond * 1000:.1f} ms from commit to its join done; four plain "
          f"jobs {plain * 1000:.1f} ms (medians of {ROUNDS}); each level's hand-off "
          f"{(diamond - plain) / 2 * 1000:.1f} ms")
    sequenced, unsequenced = sequence_drain(database)
    print(f"sequences: 2,000 jobs in 10 sequences {sequenced:,.0f} jobs/s; 2,000 plain jobs {unsequenced:,.0f} jobs/s")
    detail_queries(database, HISTORY)
    # last: its workflows stay unfinished (nothing runs their queues any more)
    best, median = thousand_steps_written(database)
    print(f"a workflow of 1,000 steps (a root, 998 after it, a join after all) written and committed in "
          f"{best * 1000:.1f} ms (best of 5), {median * 1000:.1f} ms (median)")

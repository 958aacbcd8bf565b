"""`outboxq demo`: business transactions that enqueue jobs (some roll back), a worker, and a check of what ran."""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter

import psycopg
from psycopg.rows import dict_row

from outboxq.queue import enqueue
from outboxq.queue.jobs import JobStatus


class RolledBack(Exception):
    """Raised inside a demo business transaction to roll it back on purpose."""


def _place_order(conn: psycopg.Connection, run: str, i: int, rolled_back: set[str]) -> list[str]:
    """One business transaction: an order row and its jobs. Every 9th one rolls back."""
    tags = []
    try:
        with conn.transaction():
            order_id = conn.execute(
                "INSERT INTO orders (customer, amount) VALUES (%s, %s) RETURNING id", (f"demo-{run}", 10 + i)
            ).fetchone()["id"]
            confirmation_key = f"{run}-confirm-{i}"
            tags.append(f"{run}:confirm:{i}")
            enqueue(conn, "order-confirmation", {"tag": tags[-1], "order_id": order_id}, key=confirmation_key)
            if i % 10 == 0:
                tags.append(f"{run}:invoice:{i}")
                enqueue(conn, "invoices", {"tag": tags[-1], "order_id": order_id}, key=f"{run}-invoice-{i}",
                        depends_on=[("order-confirmation", confirmation_key)])
            if i % 7 == 0:
                tags.append(f"{run}:flaky:{i}")
                enqueue(conn, "flaky-downstream", {"tag": tags[-1]}, key=f"{run}-flaky-{i}")
            if i % 9 == 4:
                raise RolledBack()
    except RolledBack:
        rolled_back.update(tags)
        return []
    return tags


def run_demo(url: str, *, orders: int = 300, timeout_s: float = 50.0, out=sys.stdout) -> int:
    """Run the demo against `url` (already migrated); returns the exit code (0 only when all was right)."""
    from outboxq.workers import examples
    from outboxq.workers.registry import get_consumer
    from outboxq.workers.runner import Worker

    run = uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(examples.EFFECTS_TABLE_DDL)
    consumers = [get_consumer(q) for q in ("order-confirmation", "flaky-downstream", "invoices")]
    worker = Worker([c for c in consumers if c], url=url, poll_interval=0.2, concurrency=8).start()
    started = time.monotonic()
    committed: list[str] = []
    rolled_back: set[str] = set()
    try:
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            for i in range(orders):
                committed.extend(_place_order(conn, run, i, rolled_back))
            print(f"enqueued {len(committed)} jobs in {orders} business transactions "
                  f"({len(rolled_back)} jobs rolled back with their orders)", file=out)
            while True:
                rows = conn.execute(
                    "SELECT queue, status, attempts, key FROM outboxq_jobs WHERE key LIKE %s", (f"{run}-%",)
                ).fetchall()
                finished = sum(r["status"] in ("done", "dead", "cancelled") for r in rows)
                print(f"\r  progress: {finished}/{len(rows)} finished", end="", file=out, flush=True)
                if finished == len(rows) or time.monotonic() - started > timeout_s:
                    break
                time.sleep(0.25)
            print(file=out)
            effects = conn.execute(
                "SELECT tag, queue, attempt, written_at FROM outboxq_demo_effects WHERE tag LIKE %s",
                (f"{run}:%",),
            ).fetchall()
    finally:
        worker.stop(timeout=10)
    elapsed = time.monotonic() - started

    problems = _check(rows, effects, committed, rolled_back)
    summary = Counter((r["queue"], r["status"]) for r in rows)
    print(f"\n{'queue':<22}{'status':<10}{'jobs':>6}", file=out)
    for (queue, status), n in sorted(summary.items()):
        print(f"{queue:<22}{status:<10}{n:>6}", file=out)
    print(f"\n{len(effects)} effects written for {len(committed)} committed jobs; "
          f"{len(rolled_back)} rolled-back jobs never ran; {elapsed:.1f} s", file=out)
    if problems:
        print("DEMO FAILED:\n  " + "\n  ".join(problems), file=out)
        return 1
    print("demo OK: every committed job ran exactly once, no rolled-back job ran, "
          "the flaky job succeeded on its retry, invoices ran after their confirmations", file=out)
    return 0


def _check(rows: list[dict], effects: list[dict], committed: list[str], rolled_back: set[str]) -> list[str]:
    problems = []
    not_done = [r for r in rows if r["status"] != JobStatus.DONE.value]
    if not_done:
        problems.append(f"{len(not_done)} jobs did not finish as done: {not_done[:3]}")
    tags = [e["tag"] for e in effects]
    if len(tags) != len(set(tags)):
        problems.append("an effect was written twice")
    if set(tags) != set(committed):
        problems.append(f"effects differ from committed jobs: missing {sorted(set(committed) - set(tags))[:5]}")
    if set(tags) & rolled_back:
        problems.append(f"rolled-back jobs ran: {sorted(set(tags) & rolled_back)[:5]}")
    flaky = [r for r in rows if r["queue"] == "flaky-downstream"]
    if any(r["attempts"] != 2 for r in flaky):
        problems.append("a flaky-downstream job did not take exactly two attempts")
    written = {e["tag"]: e["written_at"] for e in effects}
    for tag, at in written.items():
        if ":invoice:" in tag:
            confirm = written.get(tag.replace(":invoice:", ":confirm:"))
            if confirm is None or confirm > at:
                problems.append(f"{tag} ran before its confirmation")
    return problems

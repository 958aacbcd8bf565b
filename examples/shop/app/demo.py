"""The shop's demo (`outboxq demo` runs it): orders placed with their jobs, one in nine rolled back; a worker
runs the shop's handlers; exit 0 only when every committed job ran exactly once and no rolled-back one ran.

    python -m app.demo --orders 300        (from examples/shop, with DATABASE_URL set)
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from psycopg.rows import dict_row
from sqlalchemy.orm import Session

from app import handlers  # noqa: F401 - registers the shop's consumers
from app.db import engine
from app.orders import place_order
from outboxq import Worker, enqueue
from outboxq.workers.registry import get_consumer

HERE = Path(__file__).resolve().parents[1]


class RolledBack(Exception):
    """Raised inside a demo business transaction to roll it back on purpose."""


def migrate() -> None:
    """The shop's own alembic history (outboxq's is migrated by `outboxq migrate`)."""
    command.upgrade(Config(str(HERE / "alembic.ini")), "head")


def _place(run: str, i: int, rolled_back: set[str]) -> list[str]:
    """One business transaction: an order and its jobs. Every 9th one rolls back."""
    tags: list[str] = []
    try:
        with Session(engine()) as session, session.begin():
            order, _ = place_order(session, f"demo-{run}", Decimal(10 + i))
            tags.append(f"order-confirmation:{order.id}")
            if i % 10 == 0:
                tags.append(f"{run}:invoice:{order.id}")
                enqueue(session, "invoices", {"tag": tags[-1], "order_id": order.id}, key=f"{run}-invoice-{i}",
                        depends_on=[("order-confirmation", f"order-{order.id}")])
            if i % 7 == 0:
                tags.append(f"{run}:flaky:{i}")
                enqueue(session, "flaky-downstream", {"tag": tags[-1]}, key=f"{run}-flaky-{i}")
            if i % 9 == 4:
                raise RolledBack()
    except RolledBack:
        rolled_back.update(tags)
        return []
    return tags


def run(url: str, orders: int, timeout_s: float = 50.0, out=sys.stdout) -> int:
    """Place the orders, run the worker until every job finished, check, and print a summary."""
    run_id = uuid.uuid4().hex[:8]
    consumers = [get_consumer(q) for q in ("order-confirmation", "flaky-downstream", "invoices")]
    worker = Worker([c for c in consumers if c], url=url, poll_interval=0.2, concurrency=8).start()
    started = time.monotonic()
    committed: list[str] = []
    rolled_back: set[str] = set()
    try:
        for i in range(orders):
            committed.extend(_place(run_id, i, rolled_back))
        print(f"enqueued {len(committed)} jobs in {orders} business transactions "
              f"({len(rolled_back)} jobs rolled back with their orders)", file=out)
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            while True:
                rows = conn.execute(
                    "SELECT j.queue, j.status, j.attempts, j.key FROM outboxq_jobs j "
                    "WHERE j.key LIKE %(run)s OR j.key IN (SELECT 'order-' || id FROM orders WHERE customer = %(c)s)",
                    {"run": f"{run_id}-%", "c": f"demo-{run_id}"},
                ).fetchall()
                finished = sum(r["status"] in ("done", "dead", "cancelled") for r in rows)
                print(f"\r  progress: {finished}/{len(rows)} finished", end="", file=out, flush=True)
                if finished == len(rows) or time.monotonic() - started > timeout_s:
                    break
                time.sleep(0.25)
            print(file=out)
            effects = conn.execute("SELECT tag, queue, attempt, written_at FROM shop_effects").fetchall()
    finally:
        worker.stop(timeout=10)
    effects = [e for e in effects if e["tag"] in set(committed) | rolled_back]
    problems = _check(rows, effects, committed, rolled_back)
    summary = Counter((r["queue"], r["status"]) for r in rows)
    print(f"\n{'queue':<22}{'status':<10}{'jobs':>6}", file=out)
    for (queue, status), n in sorted(summary.items()):
        print(f"{queue:<22}{status:<10}{n:>6}", file=out)
    print(f"\n{len(effects)} effects written for {len(committed)} committed jobs; "
          f"{len(rolled_back)} rolled-back jobs never ran; {time.monotonic() - started:.1f} s", file=out)
    if problems:
        print("DEMO FAILED:\n  " + "\n  ".join(problems), file=out)
        return 1
    print("demo OK: every committed job ran exactly once, no rolled-back job ran, "
          "the flaky job succeeded on its retry, invoices ran after their confirmations", file=out)
    return 0


def _check(rows: list[dict], effects: list[dict], committed: list[str], rolled_back: set[str]) -> list[str]:
    problems = []
    not_done = [r for r in rows if r["status"] != "done"]
    if not_done:
        problems.append(f"{len(not_done)} jobs did not finish as done: {not_done[:3]}")
    tags = [e["tag"] for e in effects]
    if len(tags) != len(set(tags)):
        problems.append("an effect was written twice")
    if set(tags) != set(committed):
        problems.append(f"effects differ from committed jobs: missing {sorted(set(committed) - set(tags))[:5]}")
    if set(tags) & rolled_back:
        problems.append(f"rolled-back jobs ran: {sorted(set(tags) & rolled_back)[:5]}")
    if any(r["attempts"] != 2 for r in rows if r["queue"] == "flaky-downstream"):
        problems.append("a flaky-downstream job did not take exactly two attempts")
    written = {e["tag"]: e["written_at"] for e in effects}
    for tag, at in written.items():
        if ":invoice:" in tag:
            confirmation = written.get(f"order-confirmation:{tag.rsplit(':', 1)[1]}")
            if confirmation is None or confirmation > at:
                problems.append(f"{tag} ran before its order's confirmation")
    return problems


def main() -> int:
    """Entry point of `python -m app.demo`."""
    parser = argparse.ArgumentParser(prog="python -m app.demo", description=__doc__)
    parser.add_argument("--orders", type=int, default=300)
    args = parser.parse_args()
    migrate()
    from outboxq.db import database_url

    return run(database_url(), args.orders)


if __name__ == "__main__":
    sys.exit(main())

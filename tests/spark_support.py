"""Helpers of the Spark consumer tests: payloads, processors, crash hooks, a second database, table dumps."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql as pgsql

from outboxq import enqueue_many
from outboxq.db import url_with_database
from outboxq.spark_jobs.consumer import Consumer, ConsumerConfig
from outboxq.spark_jobs.processing import BatchEngine

QUEUE = "orders-in"
TABLE = "customer_totals"
RESULTS = "outboxq_results"  # the schema output tables go to (settings.spark_results_schema)


class Crash(Exception):
    """Raised by a step hook: the process 'dies' at that step (its connection is dropped, uncommitted)."""


def crash_at(step: str, nth: int = 1):
    """A step hook that raises Crash the nth time the consumer reaches `step`."""
    seen = {"count": 0}

    def hook(reached: str) -> None:
        if reached == step:
            seen["count"] += 1
            if seen["count"] == nth:
                raise Crash(step)

    return hook


def spark_env(db_url: str, **extra: str) -> dict[str, str]:
    """The environment of an `outboxq spark run` subprocess on the test database, local[1] Spark."""
    return {**os.environ, "DATABASE_URL": db_url, "OUTBOXQ_SPARK_MASTER": "local[1]",
            "OUTBOXQ_SPARK_SHUFFLE_PARTITIONS": "1", **extra}


def spark_run_command(*options: str, processor: str = "outboxq.spark_jobs.examples:order_totals",
                      output_table: str = "order_totals") -> list[str]:
    """`outboxq spark run --json` of the test queue with the processor, plus the options."""
    return [sys.executable, "-m", "outboxq.cli", "spark", "run", "--queue", QUEUE, "--processor", processor,
            "--output-table", output_table, "--json", *options]


def expected_totals(payloads: list[dict[str, Any]]) -> dict[str, tuple[int, Decimal]]:
    """Per customer: the number of orders and their total amount (what order_totals sums to)."""
    totals: dict[str, list] = {}
    for p in payloads:
        entry = totals.setdefault(p["customer"], [0, Decimal("0")])
        entry[0] += 1
        entry[1] += Decimal(str(p["amount"]))
    return {c: (n, t) for c, (n, t) in totals.items()}


def summed_totals(rows: list[tuple]) -> dict[str, tuple[int, Decimal]]:
    """Rows (customer, orders, total, delivery_hash) of several batches summed per customer."""
    totals: dict[str, list] = {}
    for customer, orders, total, _ in rows:
        entry = totals.setdefault(customer, [0, Decimal("0")])
        entry[0] += orders
        entry[1] += total
    return {c: (n, t) for c, (n, t) in totals.items()}


def order_payloads(n: int, customers: int = 5) -> list[dict[str, Any]]:
    """n order payloads over a few customers, amounts exact in cents."""
    return [{"customer": f"c{i % customers}", "amount": round(1 + (i * 37 % 1000) / 100, 2)} for i in range(n)]


def enqueue_orders(url: str, payloads: list[Any], queue: str = QUEUE) -> list[int]:
    """Enqueue and commit the payloads; their job ids."""
    with psycopg.connect(url) as conn:
        jobs = enqueue_many(conn, queue, payloads)
        conn.commit()
    return [job.id for job in jobs]


def plain_customer_totals(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per customer of the batch: number of orders and total amount (a processor that aggregates)."""
    totals: dict[str, list] = {}
    for record in records:
        if record.get("amount") == "boom":
            raise ValueError(f"cannot read amount {record['amount']!r} of job {record['job_id']}")
        entry = totals.setdefault(record["customer"], [0, Decimal("0")])
        entry[0] += 1
        entry[1] += Decimal(str(record["amount"]))
    return [{"customer": c, "orders": n, "total": t} for c, (n, t) in sorted(totals.items())]


def consumer(url: str, engine: BatchEngine, *, batch_size: int = 30, processor_id: str = "totals",
             output_table: str = TABLE, queue: str = QUEUE, on_step=None, **config: Any) -> Consumer:
    """A consumer of the test queue (not started)."""
    cfg = ConsumerConfig(queue=queue, processor="tests:totals", output_table=output_table,
                         batch_size=batch_size, processor_id=processor_id, poll_interval=0.05, **config)
    return Consumer(url, engine, cfg, on_step=on_step or (lambda step: None))


def run_until_empty(url: str, engine: BatchEngine, **options: Any) -> Any:
    """Start a consumer (new epoch), drain the queue, close it; its stats. A Crash propagates."""
    c = consumer(url, engine, **options)
    try:
        c.start()
        return c.run(until_empty=True)
    finally:
        c.close()  # after a Crash: what the 'dead' process had not committed is gone with its connection


def table_rows(url: str, table: str = TABLE) -> list[tuple]:
    """Every row of the output table (in the results schema), sorted (delivery hash included)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(pgsql.SQL("SELECT * FROM {}").format(pgsql.Identifier(RESULTS, table))).fetchall()
    return sorted(rows, key=repr)


def statuses(url: str, queue: str = QUEUE) -> dict[str, int]:
    """Job counts per status of the queue."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT status, count(*) FROM outboxq_jobs WHERE queue = %s GROUP BY 1",
                            (queue,)).fetchall()
    return dict(rows)


@contextmanager
def extra_database(server_url: str, template: str) -> Iterator[str]:
    """Another fresh migrated database (for a reference run with the same job ids)."""
    name = f"outboxq_ref_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield url_with_database(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

"""What the bench scripts share: a fresh migrated database, and the time a worker takes to drain it."""

from __future__ import annotations

import time
from collections.abc import Iterable

import psycopg

from outboxq.db import url_with_database
from outboxq.queue import migrate
from outboxq.tools.bench import UNFINISHED_SQL
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker


def fresh_database(admin_url: str, name: str) -> str:
    """Drop and create database `name` on `admin_url`'s server, migrate it; its URL."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    url = url_with_database(admin_url, name)
    migrate.upgrade(url)
    return url


def drain_seconds(url: str, queues: Iterable[str], **worker_options: object) -> float:
    """Seconds one in-process worker (no-op handlers) takes until no job of the database is unfinished."""
    worker = Worker([Consumer(q, lambda payload: None) for q in queues], url=url, **worker_options)
    started = time.perf_counter()
    worker.start()
    # The check reads the partial indexes of unfinished jobs, not the whole table: a count over every row version
    # every 50 ms took a core's share from the drain it measures, more so beside dead rows.
    with psycopg.connect(url, autocommit=True) as conn:
        while conn.execute(UNFINISHED_SQL["outboxq"]).fetchone()[0]:
            time.sleep(0.05)
    elapsed = time.perf_counter() - started
    worker.stop(timeout=5)
    return elapsed

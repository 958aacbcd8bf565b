"""What the bench scripts share: a fresh migrated database and the time a worker takes to drain it (an API
process to load: tools/bench_http.py)."""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from outboxq.db import url_with_database
from outboxq.queue import migrate
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker

# The harness (tools/, `python -m tools bench`) is the checkout's own package, not installed with outboxq: these
# scripts run from a checkout and find it at the repository's root.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.bench import UNFINISHED_SQL  # noqa: E402


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


def server_or_embedded(server_url: str | None, prefix: str) -> str:
    """`server_url`, or the URL of an embedded PostgreSQL started for this run (deleted at exit)."""
    if server_url:
        return server_url
    from outboxq.embedded import start_embedded

    return start_embedded(Path(tempfile.mkdtemp(prefix=prefix)) / "pgdata", cleanup_mode="delete")


@contextmanager
def scratch_database(server_url: str, prefix: str) -> Iterator[str]:
    """A migrated database of a new name on `server_url`'s server, dropped at the end; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    url = fresh_database(server_url, name)
    try:
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

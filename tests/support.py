"""Helpers shared by the tests: wait for a condition, read a job's status, hold jobs of a limited queue."""

from __future__ import annotations

import re
import shutil
import time

import psycopg
from psycopg import sql as pgsql

# The browser of the browser tests (scripts/test installs Debian's chromium when it is missing).
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.02):
    """Poll `predicate` until it returns something truthy (returned), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def status_of(url: str, job_id: int) -> str:
    """The job's status, read on a fresh connection."""
    with psycopg.connect(url) as c:
        return c.execute("SELECT status FROM outboxq_jobs WHERE id = %s", (job_id,)).fetchone()[0]


def claim_running(url: str, queue: str, limit_keys: list[str]) -> None:
    """Enqueue one job per limit key in a per-key queue (global_concurrency=10 per key) and claim them all with
    the worker's own claim: they stay running (under a lease) until the test ends."""
    from outboxq import enqueue_many
    from outboxq.queue import limits
    from outboxq.workers.registry import Consumer
    from outboxq.workers.runner import Worker

    consumer = Consumer(queue, lambda payload: None, global_concurrency=10, limit_by="tenant")
    with psycopg.connect(url) as conn:
        enqueue_many(conn, queue, [{"n": i} for i in range(len(limit_keys))], limit_keys=limit_keys)
        limits.declare(conn, consumer.limits)
        conn.commit()
    worker = Worker([consumer], url=url, run_maintenance=False, listen=False)
    with worker.connect() as conn:
        assert len(worker.claim(conn, consumer, len(limit_keys))) == len(limit_keys)


def sequence_held_by_a_dead_job(conn, queue: str, sequence: str):
    """Two jobs of `sequence`; the first made dead and the promotion run: (the dead job, the one it holds)."""
    from outboxq import enqueue
    from outboxq.workers.maintenance import promote

    dead = enqueue(conn, queue, {}, sequence=sequence)
    held = enqueue(conn, queue, {}, sequence=sequence)
    conn.commit()
    conn.execute("UPDATE outboxq_jobs SET status = 'dead', finished_at = now() WHERE id = %s", (dead.id,))
    conn.commit()
    promote.run_once(conn)
    conn.commit()
    return dead, held


def stop_processes(*procs) -> None:
    """SIGTERM each process still running (None entries are skipped), then wait for each; kill what hangs."""
    import signal
    import subprocess

    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        if proc is not None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def explain_prepared(conn, statement: str, values: dict) -> list[dict]:
    """EXPLAIN (FORMAT JSON) of the plans `conn` runs for `statement` as psycopg prepared it: one for each prepared
    statement found by its text up to the first parameter (psycopg prepares a statement once for each set of
    parameter types it runs with: a claim from the front of the index sends its cursor as untyped NULLs); the
    values given as literals, in psycopg's order of first use. A dict-row connection, in a transaction the
    caller rolls back."""
    names = [r["name"] for r in conn.execute("SELECT name FROM pg_prepared_statements WHERE starts_with(statement, %s)",
                                             (statement[:statement.index("%")],)).fetchall()]
    assert names, "not prepared on this connection"
    params = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    return [conn.execute(pgsql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {}({})").format(
        pgsql.Identifier(name), pgsql.SQL(", ").join(pgsql.Literal(values[n]) for n in params)),
    ).fetchone()["QUERY PLAN"][0]["Plan"] for name in names]


def plan_nodes(plan: dict):
    """Every node of an EXPLAIN (FORMAT JSON) plan, depth first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)

"""Helpers shared by the tests: wait for a condition, read a job's status."""

from __future__ import annotations

import time

import psycopg


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

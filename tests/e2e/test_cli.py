"""The `outboxq` command as a user runs it: migrate, demo, and the refusal to run on an old schema."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

from outboxq.db import url_with_database

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, url, timeout=120):
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "outboxq.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_migrate_then_demo_runs_and_reports_a_correct_summary(pg_server_url):
    name = f"outboxq_demo_{os.getpid()}"
    with psycopg.connect(pg_server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        c.execute(f'CREATE DATABASE "{name}"')
    url = url_with_database(pg_server_url, name)
    try:
        refused = run_cli("queues", url=url)
        assert refused.returncode == 2 and "outboxq migrate" in refused.stderr

        migrated = run_cli("migrate", url=url)
        assert migrated.returncode == 0, migrated.stderr
        assert "schema is at revision" in migrated.stdout

        demo = run_cli("--log-level", "ERROR", "demo", "--orders", "120", url=url)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "demo OK" in demo.stdout
        with psycopg.connect(url) as c:
            statuses = dict(c.execute("SELECT status, count(*) FROM outboxq_jobs GROUP BY 1").fetchall())
            effects = c.execute("SELECT count(*), count(DISTINCT tag) FROM shop_effects").fetchone()
        assert set(statuses) == {"done"}
        assert effects[0] == effects[1] == statuses["done"]

        queues = run_cli("queues", url=url)
        assert queues.returncode == 0
        assert "order-confirmation" in queues.stdout and "flaky-downstream" in queues.stdout
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

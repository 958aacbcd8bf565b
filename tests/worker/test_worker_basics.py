"""The worker on a real PostgreSQL: retries, dead jobs, fencing, several processes, graceful shutdown."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from outboxq import JobStatus, enqueue, enqueue_many, get_job
from outboxq.workers.executor import execute
from outboxq.workers.maintenance import rescue
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.handlers_basic import RUNS_TABLE_DDL
from tests.support import status_of, stop_processes, wait_for

ROOT = Path(__file__).resolve().parents[2]




def job_status(url, job_id):
    with psycopg.connect(url) as c:
        return get_job(c, job_id).status


def test_failed_attempts_are_retried_with_backoff_until_success(db_url):
    attempts_seen = []

    def flaky(payload, ctx):
        attempts_seen.append((ctx.attempt, time.monotonic()))
        if ctx.attempt < 3:
            raise RuntimeError(f"boom {ctx.attempt}")

    consumer = Consumer("flaky", flaky, backoff_base=0.3, backoff_max=1.0, jitter=0.0)
    with psycopg.connect(db_url) as conn:
        job = enqueue(conn, "flaky", {"x": 1})
        conn.commit()
    worker = Worker([consumer], url=db_url, poll_interval=0.05, run_maintenance=False).start()
    try:
        wait_for(lambda: job_status(db_url, job.id) is JobStatus.DONE)
    finally:
        worker.stop(timeout=5)
    assert [a for a, _ in attempts_seen] == [1, 2, 3]
    # The second retry waited about twice as long as the first (exponential backoff).
    gap1 = attempts_seen[1][1] - attempts_seen[0][1]
    gap2 = attempts_seen[2][1] - attempts_seen[1][1]
    assert gap1 >= 0.25 and gap2 >= 0.55
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        done = get_job(c, job.id)
        errors = c.execute("SELECT attempt, error FROM outboxq_job_errors WHERE job_id = %s ORDER BY attempt",
                           (job.id,)).fetchall()
    assert done.attempts == 3
    assert [(e["attempt"], e["error"]) for e in errors] == [(1, "RuntimeError: boom 1"), (2, "RuntimeError: boom 2")]


def test_a_job_is_dead_when_its_attempts_are_exhausted(db_url):
    def always_fails(payload, ctx):
        raise ValueError("never works")

    consumer = Consumer("doomed", always_fails, max_attempts=3, backoff_base=0.01, jitter=0.0)
    with psycopg.connect(db_url) as conn:
        job = enqueue(conn, "doomed", {})
        conn.commit()
    worker = Worker([consumer], url=db_url, poll_interval=0.05, run_maintenance=False).start()
    try:
        wait_for(lambda: job_status(db_url, job.id) is JobStatus.DEAD)
    finally:
        worker.stop(timeout=5)
    with psycopg.connect(db_url) as c:
        dead = get_job(c, job.id)
    assert dead.attempts == 3
    assert dead.last_error == "ValueError: never works"
    assert "never works" in dead.last_traceback
    assert dead.finished_at is not None


def test_max_attempts_given_at_enqueue_wins_over_the_consumer_default(db_url):
    consumer = Consumer("doomed", lambda p, c: 1 / 0, max_attempts=10, backoff_base=0.01, jitter=0.0)
    with psycopg.connect(db_url) as conn:
        job = enqueue(conn, "doomed", {}, max_attempts=1)
        conn.commit()
    worker = Worker([consumer], url=db_url, poll_interval=0.05, run_maintenance=False).start()
    try:
        wait_for(lambda: job_status(db_url, job.id) is JobStatus.DEAD)
    finally:
        worker.stop(timeout=5)
    with psycopg.connect(db_url) as c:
        assert get_job(c, job.id).attempts == 1


def test_zombie_worker_cannot_complete_a_rescued_job(db_url, caplog):
    consumer = Consumer("payments", lambda p, c: "ok")
    zombie = Worker([consumer], url=db_url, listen=False, run_maintenance=False)
    successor = Worker([consumer], url=db_url, listen=False, run_maintenance=False)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        job_id = enqueue(conn, "payments", {"amount": 5}).id
        conn.commit()
        [zombie_job] = zombie.claim(conn, consumer, 1)
        # The zombie freezes past its lease; any worker's rescue loop takes the job back.
        conn.execute("UPDATE outboxq_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
                     (job_id,))
        conn.commit()
        assert [r["id"] for r in rescue.run_once(conn)] == [job_id]
        conn.execute("UPDATE outboxq_jobs SET run_at = now() WHERE id = %s", (job_id,))
        conn.commit()
        [new_job] = successor.claim(conn, consumer, 1)
        assert new_job.lease_token != zombie_job.lease_token

        with caplog.at_level(logging.WARNING, logger="outboxq.worker"):
            zombie.write_outcomes(conn, [execute(zombie_job, None)])
        assert get_job(conn, job_id).status is JobStatus.RUNNING  # the zombie's completion was refused
        assert "fenced" in caplog.text
        assert zombie.stats["fenced"] == 1

        successor.write_outcomes(conn, [execute(new_job, None)])
        assert get_job(conn, job_id).status is JobStatus.DONE
        assert successor.stats["completed"] == 1


def _start_worker(db_url, *extra, handlers="tests.handlers_basic"):
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT), "OUTBOXQ_POLL_INTERVAL": "0.2"}
    return subprocess.Popen(
        [sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "worker", "--processes", "1", "--handlers", handlers,
         *extra],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def test_several_worker_processes_never_run_the_same_job_twice(db_url):
    total = 3000
    with psycopg.connect(db_url) as conn:
        conn.execute(RUNS_TABLE_DDL)
        conn.commit()
    workers = [_start_worker(db_url, "--queues", "count", "--concurrency", "4", "--batch-size", "50")
               for _ in range(3)]
    try:
        with psycopg.connect(db_url, autocommit=True) as c:
            # Every process up (in the workers' registry) before there is work: all of them compete for it.
            wait_for(lambda: c.execute("SELECT count(*) FROM outboxq_workers").fetchone()[0] == 3, timeout=60)
            enqueue_many(c, "count", [{"i": i} for i in range(total)])
            wait_for(lambda: c.execute(
                "SELECT count(*) FROM outboxq_jobs WHERE status = 'done'").fetchone()[0] == total, timeout=90)
            runs, distinct_jobs, pids = c.execute(
                "SELECT count(*), count(DISTINCT job_id), count(DISTINCT pid) FROM test_runs").fetchone()
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=30) for w in workers]
    assert runs == total and distinct_jobs == total
    assert pids == 3  # every process took part
    assert codes == [0, 0, 0]


def test_the_worker_command_runs_with_the_collector_tuned_for_a_worker(db_url):
    # (outboxq.gc_tuning: what start-up built is frozen, young collections every YOUNG_THRESHOLD allocations.)
    from outboxq.gc_tuning import YOUNG_THRESHOLD

    worker = _start_worker(db_url, handlers="tests.handlers_collector")
    try:
        with psycopg.connect(db_url, autocommit=True) as c:
            job = enqueue(c, "collector", {})
            wait_for(lambda: status_of(db_url, job.id) == "done", timeout=60)
            result = c.execute("SELECT result FROM outboxq_jobs WHERE id = %s", (job.id,)).fetchone()[0]
    finally:
        stop_processes(worker)
    assert result["young_threshold"] == YOUNG_THRESHOLD
    assert result["frozen"] > 1000  # (the imports and the worker's own objects)


def test_sigterm_lets_the_running_job_finish_and_hands_back_the_rest(db_url):
    with psycopg.connect(db_url) as conn:
        conn.execute(RUNS_TABLE_DDL)
        jobs = enqueue_many(conn, "slow", [{"seconds": 1.5}] * 4)
        conn.commit()
    worker = _start_worker(db_url, "--queues", "slow", "--concurrency", "1")
    with psycopg.connect(db_url, autocommit=True) as c:
        enqueued_run_at = dict(c.execute("SELECT id, run_at FROM outboxq_jobs").fetchall())
        wait_for(lambda: c.execute("SELECT count(*) FROM test_runs WHERE note = 'started'").fetchone()[0] == 1)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0
        statuses = dict(c.execute("SELECT id, status FROM outboxq_jobs").fetchall())
        attempts = dict(c.execute("SELECT id, attempts FROM outboxq_jobs").fetchall())
        run_at = dict(c.execute("SELECT id, run_at FROM outboxq_jobs").fetchall())
        finished = c.execute("SELECT count(*) FROM test_runs WHERE note = 'finished'").fetchone()[0]
    assert finished == 1
    assert sorted(statuses.values()) == ["done", "queued", "queued", "queued"]
    assert all(attempts[j.id] == 0 for j in jobs if statuses[j.id] == "queued")
    # handed back in their place: ahead of any job enqueued since, as before they were claimed
    assert all(run_at[j.id] == enqueued_run_at[j.id] for j in jobs if statuses[j.id] == "queued")


def test_worker_refuses_an_unmigrated_database(pg_server_url, tmp_path):
    from outboxq.db import url_with_database

    name = f"outboxq_empty_{os.getpid()}"
    with psycopg.connect(pg_server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        proc = _start_worker(url_with_database(pg_server_url, name))
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 2
        assert b"outboxq migrate" in err
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_worker_started_before_its_database_answers_waits_for_it_then_works(pg_server_url, template_db):
    """A database that is (re)starting refuses connections; here one that does not exist yet does."""
    from outboxq.db import url_with_database

    name = f"outboxq_late_{os.getpid()}"
    url = url_with_database(pg_server_url, name)
    proc = _start_worker(url, "--queues", "count")
    err_lines: list[bytes] = []
    reader = threading.Thread(target=lambda: err_lines.extend(iter(proc.stderr.readline, b"")), daemon=True)
    reader.start()
    try:
        # The database is created once the worker says it waits for it (a slow start must not find it there).
        wait_for(lambda: any(b"waiting up to 30 s for the database" in line for line in err_lines)
                 or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, b"".join(err_lines).decode()
        with psycopg.connect(pg_server_url, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
        with psycopg.connect(url) as conn:
            conn.execute(RUNS_TABLE_DDL)
            job = enqueue(conn, "count", {"i": 1})
            conn.commit()
            wait_for(lambda: get_job(conn, job.id).status == JobStatus.DONE, timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, b"".join(err_lines).decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        with psycopg.connect(pg_server_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_worker_gives_up_on_a_database_that_never_answers(pg_server_url):
    from outboxq.db import url_with_database

    env = {**os.environ, "OUTBOXQ_DB_WAIT_S": "1", "DATABASE_URL": url_with_database(pg_server_url, "outboxq_nowhere")}
    proc = subprocess.run([sys.executable, "-m", "outboxq.cli", "worker", "--processes", "1", "--handlers",
                           "tests.handlers_basic"], env=env, cwd=ROOT, capture_output=True, timeout=60)
    assert proc.returncode != 0
    assert b"outboxq: cannot reach the database" in proc.stderr and b"outboxq_nowhere" in proc.stderr
    assert b"Traceback" not in proc.stderr


@pytest.mark.parametrize("is_async", [False, True])
def test_sync_and_async_handlers_both_run(db_url, is_async):
    seen = []
    if is_async:
        async def handler(payload, ctx):
            seen.append(payload["n"])
    else:
        def handler(payload, ctx):
            seen.append(payload["n"])
    consumer = Consumer("mixed", handler)
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "mixed", [{"n": i} for i in range(50)])
        conn.commit()
    worker = Worker([consumer], url=db_url, poll_interval=0.05).start()
    try:
        wait_for(lambda: len(seen) == 50)
    finally:
        worker.stop(timeout=5)
    assert sorted(seen) == list(range(50))


def test_a_workers_stats_count_its_claim_statements_and_its_writes(db_url):
    """stats["claims"] counts the dispatcher's claim statements and stats["writes"] the completer's writes: what
    the benchmark reads to tell a drain that took more round trips from one that took the same on a slower
    machine."""
    seen = []
    consumer = Consumer("counted", lambda payload, ctx: seen.append(payload["n"]))
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "counted", [{"n": i} for i in range(50)])
        conn.commit()
    worker = Worker([consumer], url=db_url, poll_interval=0.05, batch_size=20, concurrency=4,
                    run_maintenance=False).start()
    try:
        wait_for(lambda: worker.stats["completed"] == 50)
    finally:
        worker.stop(timeout=5)
    stats = worker.stats
    assert stats["claimed"] == 50 and sorted(seen) == list(range(50))
    # at most 20 jobs a claim: three claims at least, and the empty ones while it waited for more
    assert stats["claims"] >= 3
    # each write completes at least one job, and all 50 were written
    assert 1 <= stats["writes"] <= 50

"""Leases, heartbeats, rescue and fencing on a real PostgreSQL (issue 3, behaviour 1 and 8)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from outboxq import LeaseLost, enqueue, enqueue_many, get_job
from outboxq.queue.jobs import JobStatus
from outboxq.settings import get_settings
from outboxq.workers.executor import execute
from outboxq.workers.maintenance import rescue
from outboxq.workers.registry import Consumer, consumer, get_consumer
from outboxq.workers.runner import Worker
from tests.handlers_runtime import EFFECTS_DDL, RUNS_DDL
from tests.support import status_of, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _start_worker(db_url, log_path, *extra, **env_extra):
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT), **env_extra}
    log = open(log_path, "ab")  # noqa: SIM115 - closed by the test through the Popen's lifetime
    return subprocess.Popen(
        [sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "worker", "--processes", "1",
         "--handlers", "tests.handlers_runtime", "--queues", "kill_effects,kill_plain", *extra],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )


def test_sigkilled_worker_jobs_are_rescued_and_completed_once_with_transaction_effects_once(db_url, tmp_path):
    with psycopg.connect(db_url) as conn:
        conn.execute(RUNS_DDL)
        conn.execute(EFFECTS_DDL)
        effect_jobs = enqueue_many(conn, "kill_effects", [{"i": i} for i in range(3)])
        plain_jobs = enqueue_many(conn, "kill_plain", [{"i": i} for i in range(3)])
        conn.commit()
    all_ids = sorted(j.id for j in effect_jobs + plain_jobs)
    env = {"OUTBOXQ_BACKOFF_BASE": "0.1", "OUTBOXQ_BACKOFF_JITTER": "0"}
    victim = _start_worker(db_url, tmp_path / "victim.log", "--concurrency", "8", "--poll-interval", "0.1", **env)
    survivor = None
    try:
        with psycopg.connect(db_url, autocommit=True) as c:
            # Every job is mid-handler (the effect jobs inside their open ctx.transaction()).
            wait_for(lambda: c.execute("SELECT count(*) FROM test_runtime_runs WHERE attempt = 1"
                                       ).fetchone()[0] == 6)
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(timeout=10) == -signal.SIGKILL
            assert c.execute("SELECT count(*) FROM outboxq_jobs WHERE status = 'running'").fetchone()[0] == 6

            survivor = _start_worker(db_url, tmp_path / "survivor.log", "--poll-interval", "0.1", **env)
            wait_for(lambda: c.execute("SELECT count(*) FROM outboxq_jobs WHERE status = 'done'"
                                       ).fetchone()[0] == 6, timeout=60)
            jobs = c.execute("SELECT id, status, attempts FROM outboxq_jobs ORDER BY id").fetchall()
            effects = c.execute("SELECT job_id, attempt, pid FROM test_effects ORDER BY job_id").fetchall()
            runs = c.execute("SELECT job_id, attempt, pid FROM test_runtime_runs WHERE note = 'started'"
                             " ORDER BY job_id, attempt").fetchall()
            history = c.execute("SELECT job_id, attempt, error FROM outboxq_job_errors ORDER BY job_id").fetchall()
    finally:
        for proc in (victim, survivor):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
    assert [(j[0], j[1], j[2]) for j in jobs] == [(i, "done", 2) for i in all_ids]
    # The effect of each transactional job is there exactly once: the killed attempt's was rolled back.
    assert [(e[0], e[1]) for e in effects] == [(j.id, 2) for j in sorted(effect_jobs, key=lambda j: j.id)]
    assert {e[2] for e in effects} == {survivor.pid}
    # Each job ran twice: once in the killed process, once in the survivor; no third run.
    assert [(r[0], r[1]) for r in runs] == [(i, a) for i in all_ids for a in (1, 2)]
    assert {r[2] for r in runs if r[1] == 1} == {victim.pid}
    assert {r[2] for r in runs if r[1] == 2} == {survivor.pid}
    # The rescue is recorded as the first attempt's error.
    assert [(h[0], h[1]) for h in history] == [(i, 1) for i in all_ids]
    assert all("lease expired" in h[2] for h in history)


def test_live_long_job_with_heartbeats_is_not_rescued_while_a_rescue_loop_runs(db_url):
    release = threading.Event()
    attempts = []

    def long_handler(payload, ctx):
        attempts.append(ctx.attempt)
        release.wait(10)

    consumer = Consumer("long", long_handler, lease_s=1.0)
    with psycopg.connect(db_url) as conn:
        job = enqueue(conn, "long", {})
        conn.commit()
    worker = Worker([consumer], url=db_url, poll_interval=0.05, run_maintenance=False).start()
    rescued = []
    try:
        wait_for(lambda: attempts)
        # Another process's rescue loop, running often, for four lease lengths.
        with psycopg.connect(db_url) as rescuer:
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline:
                rescued += rescue.run_once(rescuer)
                time.sleep(0.05)
            with rescuer.cursor(row_factory=dict_row) as cur:
                row = cur.execute("SELECT status, attempts, lease_expires_at > now() AS leased "
                                  "FROM outboxq_jobs WHERE id = %s", (job.id,)).fetchone()
        release.set()
        wait_for(lambda: status_of(db_url, job.id) == "done")
    finally:
        release.set()
        worker.stop(timeout=5)
    assert rescued == []
    assert row == {"status": "running", "attempts": 1, "leased": True}
    assert attempts == [1]
    assert worker.stats["fenced"] == 0


def test_expired_lease_is_rescued_within_one_poll_interval_by_a_running_worker(db_url, monkeypatch):
    ran = []
    consumer = Consumer("orphans", lambda payload, ctx: ran.append(ctx.attempt), lease_s=0.5)
    dead_worker = Worker([consumer], url=db_url, listen=False, run_maintenance=False)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        job = enqueue(conn, "orphans", {})
        conn.commit()
        dead_worker.claim(conn, consumer, 1)  # this worker then "dies": no heartbeat, no outcome
        expires = conn.execute("SELECT lease_expires_at FROM outboxq_jobs WHERE id = %s",
                               (job.id,)).fetchone()["lease_expires_at"]
    monkeypatch.setenv("OUTBOXQ_BACKOFF_BASE", "0.05")
    get_settings.cache_clear()
    worker = Worker([consumer], url=db_url, poll_interval=0.2).start()
    try:
        wait_for(lambda: status_of(db_url, job.id) == "done", timeout=10)
    finally:
        worker.stop(timeout=5)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        [error] = conn.execute("SELECT attempt, error, failed_at FROM outboxq_job_errors WHERE job_id = %s",
                               (job.id,)).fetchall()
    assert ran == [2]
    assert error["attempt"] == 1 and "lease expired" in error["error"]
    # Rescued no earlier than the expiry, and within a poll interval of it (generous bound for slow CI).
    lag = (error["failed_at"] - expires).total_seconds()
    assert 0 <= lag < 0.2 + 1.5, lag


def test_rescue_with_injected_clock_retries_then_marks_dead_when_attempts_are_exhausted(db_url):
    consumer = Consumer("clocked", lambda p, c: None, max_attempts=2, lease_s=60)
    worker = Worker([consumer], url=db_url, listen=False, run_maintenance=False)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        job = enqueue(conn, "clocked", {})
        conn.commit()
        worker.claim(conn, consumer, 1)
        now = datetime.now(UTC)
        assert rescue.run_once(conn, now=now + timedelta(seconds=30)) == []  # lease still valid then
        [row] = rescue.run_once(conn, now=now + timedelta(seconds=61))
        assert (row["id"], row["status"], row["attempts"]) == (job.id, "retrying", 1)
        conn.execute("UPDATE outboxq_jobs SET run_at = now() WHERE id = %s", (job.id,))
        conn.commit()
        worker.claim(conn, consumer, 1)
        [row] = rescue.run_once(conn, now=now + timedelta(seconds=200))
        assert (row["status"], row["attempts"]) == ("dead", 2)
        dead = get_job(conn, job.id)
    assert dead.status is JobStatus.DEAD and dead.finished_at is not None
    assert "lease expired" in dead.last_error


@consumer("rescue-slow", backoff_base=100.0, backoff_max=1000.0, jitter=0.0)
def rescue_slow(payload) -> None:
    """A registered consumer with its own backoff: rescue must follow it."""


def test_rescue_follows_each_consumers_own_retry_policy(db_url):
    slow = get_consumer("rescue-slow")
    unknown = Consumer("rescue-unregistered", lambda p, c: None)  # not registered in this process
    worker = Worker([slow, unknown], url=db_url, listen=False, run_maintenance=False)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        slow_job = enqueue(conn, "rescue-slow", {})
        other_job = enqueue(conn, "rescue-unregistered", {})
        conn.commit()
        worker.claim(conn, slow, 1)
        worker.claim(conn, unknown, 1)
        rescued_at = datetime.now(UTC) + timedelta(seconds=61)
        rows = rescue.run_once(conn, now=rescued_at)
        assert {r["id"]: r["status"] for r in rows} == {slow_job.id: "retrying", other_job.id: "retrying"}
        run_at = {r["id"]: r["run_at"] for r in conn.execute(
            "SELECT id, run_at FROM outboxq_jobs WHERE id = ANY(%s)", ([slow_job.id, other_job.id],))}
    assert run_at[slow_job.id] - rescued_at == timedelta(seconds=100)  # the consumer's own backoff_base
    default = get_settings()  # no consumer registered: the settings' default policy, with its jitter
    delay = (run_at[other_job.id] - rescued_at).total_seconds()
    assert default.backoff_base * (1 - default.backoff_jitter) <= delay <= default.backoff_base * (1 + default.backoff_jitter)


def _zombie_and_successor(db_url, handler, queue="zombie"):
    """A job claimed by `zombie`, whose lease expired and was rescued and re-claimed by `successor`."""
    consumer = Consumer(queue, handler, lease_s=30)
    zombie = Worker([consumer], url=db_url, listen=False, run_maintenance=False, worker_id="zombie")
    successor = Worker([consumer], url=db_url, listen=False, run_maintenance=False, worker_id="successor")
    conn = psycopg.connect(db_url, row_factory=dict_row)
    job_id = enqueue(conn, queue, {"n": 1}).id
    conn.commit()
    [zombie_job] = zombie.claim(conn, consumer, 1)
    [rescued] = rescue.run_once(conn, now=datetime.now(UTC) + timedelta(seconds=31))
    assert rescued["id"] == job_id
    conn.execute("UPDATE outboxq_jobs SET run_at = now() WHERE id = %s", (job_id,))
    conn.commit()
    [new_job] = successor.claim(conn, consumer, 1)
    return conn, zombie, zombie_job, successor, new_job


def test_a_lapsed_lease_is_lost_before_any_rescue_its_heartbeat_and_transaction_are_refused(db_url):
    consumer = Consumer("lapsed", lambda payload, ctx: None, lease_s=30)
    worker = Worker([consumer], url=db_url, listen=False, run_maintenance=False, worker_id="frozen")
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        enqueue(conn, "lapsed", {"n": 1})
        conn.commit()
        [job] = worker.claim(conn, consumer, 1)
        # The worker froze past its lease; nobody rescued the job yet (it is still running under its token).
        conn.execute("UPDATE outboxq_jobs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                     "WHERE id = %s", (job.id,))
        conn.commit()
        with worker.state.lock:
            worker.state.in_flight[job.id] = job
        worker.heartbeat.renew(conn)
        assert job.ctx.fenced and job.ctx.cancelled
        row = conn.execute("SELECT status, lease_expires_at < now() AS lapsed FROM outboxq_jobs WHERE id = %s",
                           (job.id,)).fetchone()
        assert row == {"status": "running", "lapsed": True}  # not renewed: rescue takes it back
        with pytest.raises(LeaseLost), job.ctx.transaction():
            pass


def test_a_worker_frozen_inside_its_transaction_past_its_lease_cannot_commit_its_effects(db_url):
    """ctx.transaction() locks the job's row while its lease is valid, and that lock keeps every rescue away: a
    worker frozen inside the block past its lease must still not commit (its slot of a concurrency limit went
    to another job meanwhile). The completion is refused, the effects roll back, the job stays for the rescue."""
    consumer = Consumer("frozen_tx", lambda payload, ctx: None, lease_s=30)
    worker = Worker([consumer], url=db_url, listen=False, run_maintenance=False, worker_id="frozen")
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        conn.execute("CREATE TABLE effects (job_id bigint)")
        enqueue(conn, "frozen_tx", {"n": 1})
        conn.commit()
        [job] = worker.claim(conn, consumer, 1)
        with pytest.raises(LeaseLost), job.ctx.transaction() as tx:
            tx.execute("INSERT INTO effects VALUES (%s)", (job.id,))
            # Frozen here until the lease ran out (within the transaction: the row is locked by it).
            tx.execute("UPDATE outboxq_jobs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                       "WHERE id = %s", (job.id,))
        assert conn.execute("SELECT count(*) AS n FROM effects").fetchone()["n"] == 0
        assert conn.execute("SELECT status FROM outboxq_jobs WHERE id = %s", (job.id,)).fetchone()["status"] == "running"


def test_zombie_worker_cannot_fail_or_renew_a_rescued_job_and_logs_that_it_was_fenced(db_url, caplog):
    def always_fails(payload, ctx):
        raise RuntimeError("downstream says no")

    conn, zombie, zombie_job, successor, new_job = _zombie_and_successor(db_url, always_fails)
    with conn:
        with caplog.at_level(logging.WARNING, logger="outboxq.worker"):
            outcome = execute(zombie_job, None)
            assert not outcome.succeeded and not outcome.fenced
            zombie.write_outcomes(conn, [outcome])
        assert "failure refused, this worker was fenced" in caplog.text
        job = get_job(conn, zombie_job.id)
        assert (job.status, job.attempts) == (JobStatus.RUNNING, 2)
        assert conn.execute("SELECT count(*) AS n FROM outboxq_job_errors WHERE job_id = %s",
                            (job.id,)).fetchone()["n"] == 1  # only the rescue, not the zombie's failure
        assert zombie.stats["fenced"] == 1 and zombie.stats["failed"] == 0

        # Its heartbeat (as if the handler were still running) renews nothing and fences the handler.
        with zombie.state.lock:
            zombie.state.in_flight[zombie_job.id] = zombie_job
        zombie_job.finished = False
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="outboxq.worker"):
            zombie.heartbeat.renew(conn)
        assert zombie_job.ctx.fenced and zombie_job.ctx.cancelled
        assert any("lease lost (fenced)" in r.getMessage() and r.job_id == zombie_job.id for r in caplog.records)
        lease = conn.execute("SELECT lease_token, worker_id FROM outboxq_jobs WHERE id = %s",
                             (zombie_job.id,)).fetchone()
        assert lease == {"lease_token": new_job.lease_token, "worker_id": "successor"}


def test_zombie_ctx_transaction_is_refused_and_its_effects_are_not_written(db_url, caplog):
    def writes_effect(payload, ctx):
        with ctx.transaction() as tx:
            tx.execute("INSERT INTO test_effects (job_id, attempt, pid) VALUES (%s, %s, 0)",
                       (ctx.job_id, ctx.attempt))

    with psycopg.connect(db_url) as c:
        c.execute(EFFECTS_DDL)
    conn, zombie, zombie_job, successor, new_job = _zombie_and_successor(db_url, writes_effect)
    with conn:
        with caplog.at_level(logging.WARNING, logger="outboxq.worker"):
            outcome = execute(zombie_job, None)
            zombie.write_outcomes(conn, [outcome])
        assert outcome.fenced and not outcome.succeeded
        assert "no longer holds its lease" in caplog.text
        assert "effects refused, this worker was fenced" in caplog.text
        assert conn.execute("SELECT count(*) AS n FROM test_effects").fetchone()["n"] == 0
        assert get_job(conn, zombie_job.id).status is JobStatus.RUNNING

        successor.write_outcomes(conn, [execute(new_job, None)])
        assert get_job(conn, new_job.id).status is JobStatus.DONE
        assert conn.execute("SELECT job_id, attempt FROM test_effects").fetchall() == [
            {"job_id": new_job.id, "attempt": 2}]
        assert successor.stats["completed"] == 1 and zombie.stats["fenced"] == 1


@pytest.mark.parametrize("crash_point", ["before_commit", "after_commit"])
def test_ctx_transaction_effect_and_completion_commit_together(db_url, crash_point):
    """A crash inside ctx.transaction() leaves neither effect nor completion; after it, both."""

    class Crash(BaseException):
        pass

    def handler(payload, ctx):
        with ctx.transaction() as tx:
            tx.execute("INSERT INTO test_effects (job_id, attempt, pid) VALUES (%s, %s, 0)",
                       (ctx.job_id, ctx.attempt))
            if crash_point == "before_commit":
                raise Crash()
        if crash_point == "after_commit":
            raise Crash()

    consumer = Consumer("tx", handler)
    worker = Worker([consumer], url=db_url, listen=False, run_maintenance=False)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        conn.execute(EFFECTS_DDL)
        job_id = enqueue(conn, "tx", {}).id
        conn.commit()
        [job] = worker.claim(conn, consumer, 1)
        with pytest.raises(Crash):  # the worker "dies" here: no outcome is written
            execute(job, None)
        effects = conn.execute("SELECT count(*) AS n FROM test_effects").fetchone()["n"]
        status = get_job(conn, job_id).status
    if crash_point == "before_commit":
        assert (effects, status) == (0, JobStatus.RUNNING)  # rescued later, runs again
    else:
        assert (effects, status) == (1, JobStatus.DONE)  # nothing left to rescue: it never runs again

"""Cancel, pause, retention, statistics, health, test helpers and the operator's CLI (10-14)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from outboxq import enqueue, enqueue_many, get_job
from outboxq.errors import InvalidInput, InvalidTransition
from outboxq.queue import admin, sql
from outboxq.queue.jobs import JobStatus
from outboxq.testing import JobFailed, TestQueue
from outboxq.workers.claim_cursor import FROM_THE_FRONT
from outboxq.workers.maintenance import prune
from outboxq.workers.registry import Consumer, register
from outboxq.workers.runner import Worker
from tests.handlers_runtime import isolated_registry  # noqa: F401
from tests.support import status_of, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dict_conn(db_url):
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        yield c


# ---------------------------------------------------------------- cancel


def test_cancel_queued_waiting_and_retrying_jobs_so_no_worker_runs_them(dict_conn, db_url):
    ran = []
    consumer = Consumer("cancellable", lambda p, ctx: ran.append(p["name"]))
    queued = enqueue(dict_conn, "cancellable", {"name": "queued"}, key="q")
    waiting = enqueue(dict_conn, "cancellable", {"name": "waiting"}, depends_on=[("cancellable", "q")])
    retrying = enqueue(dict_conn, "cancellable", {"name": "retrying"})
    survivor = enqueue(dict_conn, "cancellable", {"name": "survivor"})
    dict_conn.execute("UPDATE outboxq_jobs SET status = 'retrying', attempts = 1 WHERE id = %s", (retrying.id,))
    dict_conn.commit()
    for job in (queued, waiting, retrying):
        cancelled = admin.cancel_job(dict_conn, job.id)
        assert cancelled.status is JobStatus.CANCELLED and cancelled.finished_at is not None
    dict_conn.commit()
    with pytest.raises(InvalidTransition, match="can no longer be cancelled"):
        admin.cancel_job(dict_conn, queued.id)
    worker = Worker([consumer], url=db_url, poll_interval=0.05).start()
    try:
        wait_for(lambda: status_of(db_url, survivor.id) == "done")
    finally:
        worker.stop(timeout=5)
    assert ran == ["survivor"]


def test_cancelling_a_running_job_sets_ctx_cancelled_and_the_job_ends_cancelled(dict_conn, db_url):
    started = threading.Event()
    observed = []

    def long_export(payload, ctx):
        started.set()
        while not ctx.cancelled:
            threading.Event().wait(0.01)
        observed.append(ctx.cancelled)

    consumer = Consumer("export", long_export, lease_s=0.6)  # heartbeats every 0.2 s carry the cancel
    job = enqueue(dict_conn, "export", {})
    dict_conn.commit()
    worker = Worker([consumer], url=db_url, poll_interval=0.05).start()
    try:
        assert started.wait(5)
        running = admin.cancel_job(dict_conn, job.id)
        dict_conn.commit()
        assert running.status is JobStatus.RUNNING and running.cancel_requested
        wait_for(lambda: status_of(db_url, job.id) == "cancelled", timeout=10)
    finally:
        worker.stop(timeout=5)
    assert observed == [True]
    assert worker.stats["cancelled"] == 1 and worker.stats["completed"] == 0


# ---------------------------------------------------------------- pause


def test_pause_stops_claims_survives_a_new_worker_and_resume_runs_the_jobs(dict_conn, db_url):
    ran = []
    paused = Consumer("mail", lambda p, ctx: ran.append(("mail", p["n"])))
    barrier = Consumer("tick", lambda p, ctx: ran.append(("tick", p["n"])))
    admin.pause_queue(dict_conn, "mail")
    mail = enqueue(dict_conn, "mail", {"n": 1})
    dict_conn.commit()
    for generation in (1, 2):  # the second Worker stands for a restarted process
        worker = Worker([paused, barrier], url=db_url, poll_interval=0.05).start()
        try:
            for n in range(3):  # the worker is up and claiming: another queue's jobs run
                tick = enqueue(dict_conn, "tick", {"n": (generation, n)})
                dict_conn.commit()
                wait_for(lambda tick=tick: status_of(db_url, tick.id) == "done")
            time.sleep(0.3)  # six poll intervals in which "mail" would have been claimed, were it not paused
        finally:
            worker.stop(timeout=5)
        assert status_of(db_url, mail.id) == "queued"
    assert [info for info in admin.queue_counts(dict_conn) if info.queue == "mail"][0].paused
    admin.resume_queue(dict_conn, "mail")
    dict_conn.commit()
    worker = Worker([paused, barrier], url=db_url, poll_interval=0.05).start()
    try:
        wait_for(lambda: status_of(db_url, mail.id) == "done")
    finally:
        worker.stop(timeout=5)
    assert ("mail", 1) in ran


# ---------------------------------------------------------------- retention and the hot path


def _set_status(conn, job_id, status, finished_at=None, attempts=1):
    conn.execute("UPDATE outboxq_jobs SET status = %s, finished_at = %s, attempts = %s WHERE id = %s",
                 (status, finished_at, attempts, job_id))


def test_prune_deletes_finished_jobs_after_their_retention_with_an_injected_clock(dict_conn, monkeypatch):
    monkeypatch.setenv("OUTBOXQ_RETENTION_DONE_S", str(7 * 86400))
    monkeypatch.setenv("OUTBOXQ_RETENTION_DEAD_S", str(30 * 86400))
    from outboxq.settings import get_settings

    get_settings.cache_clear()
    now = datetime.now(UTC)
    jobs = {s: enqueue(dict_conn, "retention", {"s": s}).id
            for s in ("done", "cancelled", "dead", "queued", "running", "retrying", "waiting")}
    extra_done = [j.id for j in enqueue_many(dict_conn, "retention", [{}] * 5)]
    for status in ("done", "cancelled", "dead"):
        _set_status(dict_conn, jobs[status], status, finished_at=now)
    for job_id in extra_done:
        _set_status(dict_conn, job_id, "done", finished_at=now)
    for status in ("running", "retrying", "waiting"):
        _set_status(dict_conn, jobs[status], status)
    dict_conn.execute("INSERT INTO outboxq_job_errors (job_id, attempt, error) VALUES (%s, 1, 'x')",
                      (jobs["dead"],))
    dict_conn.commit()

    def remaining():
        return {r["status"] for r in dict_conn.execute("SELECT status FROM outboxq_jobs").fetchall()}

    assert prune.run_once(dict_conn, now=now + timedelta(days=6)) == 0
    assert prune.run_once(dict_conn, now=now + timedelta(days=8), limit=2) == 7  # batches of 2, all of them
    assert remaining() == {"dead", "queued", "running", "retrying", "waiting"}
    assert prune.run_once(dict_conn, now=now + timedelta(days=31)) == 1
    assert remaining() == {"queued", "running", "retrying", "waiting"}
    assert dict_conn.execute("SELECT count(*) AS n FROM outboxq_job_errors").fetchone()["n"] == 0


def test_claim_query_uses_the_claim_index_with_many_finished_rows_present(dict_conn):
    dict_conn.execute("""
        INSERT INTO outboxq_jobs (queue, status, payload, attempts, finished_at)
        SELECT 'busy', 'done', '{}'::jsonb, 1, now() FROM generate_series(1, 50000)
    """)
    enqueue_many(dict_conn, "busy", [{"n": i} for i in range(20)])
    dict_conn.commit()
    dict_conn.execute("ANALYZE outboxq_jobs")
    params = {"queue": "busy", "limit": 10, "lease_token": uuid.uuid4(), "lease_s": 30.0, "worker_id": "w",
              "default_max_attempts": 5, **FROM_THE_FRONT}
    plan = "\n".join(r["QUERY PLAN"] for r in dict_conn.execute("EXPLAIN " + sql.job_claim_batch, params))
    assert "outboxq_jobs_claim_idx" in plan, plan
    assert "Seq Scan on outboxq_jobs" not in plan, plan
    rows = dict_conn.execute(sql.job_claim_batch, params).fetchall()
    dict_conn.rollback()
    assert len(rows) == 10


# ---------------------------------------------------------------- statistics and health


def test_retry_and_processing_time_statistics_per_queue(dict_conn):
    now = datetime.now(UTC)
    ids = [j.id for j in enqueue_many(dict_conn, "stats", [{}] * 6)]
    # Four done at the first attempt (100..400 ms), one done at the third attempt, one dead after two.
    for job_id, ms in zip(ids[:4], (100, 200, 300, 400), strict=True):
        dict_conn.execute("UPDATE outboxq_jobs SET status = 'done', attempts = 1, attempt_started_at = %s, "
                          "finished_at = %s WHERE id = %s", (now, now + timedelta(milliseconds=ms), job_id))
    dict_conn.execute("UPDATE outboxq_jobs SET status = 'done', attempts = 3, attempt_started_at = %s, "
                      "finished_at = %s WHERE id = %s", (now, now + timedelta(milliseconds=1000), ids[4]))
    _set_status(dict_conn, ids[5], "dead", finished_at=now, attempts=2)
    enqueue(dict_conn, "other", {})
    dict_conn.commit()
    [retries] = admin.retry_stats(dict_conn, now=now + timedelta(hours=1))
    assert (retries["queue"], retries["ok"], retries["retries"], retries["dead"]) == ("stats", 5, 3, 1)
    assert retries["retry_percentage"] == pytest.approx(100 * 3 / (5 + 1 + 3), abs=0.01)
    assert admin.retry_stats(dict_conn, now=now + timedelta(days=2)) == []  # outside the window
    assert admin.retry_stats(dict_conn, queue="other", now=now) == []
    [times] = admin.processing_time_stats(dict_conn, now=now + timedelta(hours=1), queue="stats")
    assert times["jobs"] == 5
    assert times["min_ms"] == pytest.approx(100) and times["max_ms"] == pytest.approx(1000)
    assert times["avg_ms"] == pytest.approx(400) and times["p50_ms"] == pytest.approx(300)
    assert times["p90_ms"] == pytest.approx(760) and times["p99_ms"] == pytest.approx(976)
    for too_long in (30.0, 0.0, float("nan")):  # a window of history, never all of it (CLI and HTTP alike)
        with pytest.raises(InvalidInput, match="age_days must be more than 0 and at most 7"):
            admin.retry_stats(dict_conn, age_days=too_long)


def test_health_goes_unhealthy_after_allowed_error_time_with_grace_and_hooks_into_and_out_of_error(
        dict_conn, db_url):
    calls = []
    outcome = {"fail": True}

    def downstream(payload):
        if outcome["fail"]:
            raise ConnectionError("down")

    register(Consumer("health", downstream, backoff_base=0.0, jitter=0))
    enqueue_many(dict_conn, "health", [{}] * 3)
    dict_conn.commit()
    tq = TestQueue(db_url)
    tq.drain("health", expect_success=False, limit=1)
    failing_since = dict_conn.execute("SELECT failing_since FROM outboxq_queues WHERE queue = 'health'"
                                      ).fetchone()["failing_since"]
    assert failing_since is not None

    monitor = admin.HealthMonitor(healthy_allowed_error_time_s=60, startup_grace_s=100, started_at=0.0,
                                  on_error=lambda r: calls.append(("error", r)),
                                  on_recovered=lambda r: calls.append(("recovered", r)))
    # In the start-up grace period, even a long error is healthy.
    report = monitor.check(dict_conn, now=failing_since + timedelta(seconds=600), monotonic_now=50.0)
    assert report["healthy"] and report["in_startup_grace"] and calls == []
    # After it: an error younger than the allowed time is still healthy.
    assert monitor.check(dict_conn, now=failing_since + timedelta(seconds=30), monotonic_now=500.0)["healthy"]
    report = monitor.check(dict_conn, now=failing_since + timedelta(seconds=61), monotonic_now=500.0)
    assert not report["healthy"]
    assert [q["queue"] for q in report["queues_in_error"]] == ["health"]
    assert [c[0] for c in calls] == ["error"]
    monitor.check(dict_conn, now=failing_since + timedelta(seconds=90), monotonic_now=500.0)
    assert [c[0] for c in calls] == ["error"]  # called once going into error, not on every check

    outcome["fail"] = False
    tq.run_one("health")  # one success: the queue is out of error
    report = monitor.check(dict_conn, now=failing_since + timedelta(seconds=120), monotonic_now=500.0)
    assert report["healthy"] and report["queues_in_error"] == []
    assert [c[0] for c in calls] == ["error", "recovered"]


# ---------------------------------------------------------------- outboxq.testing


def test_testing_helpers_run_in_the_calling_thread_and_check_idempotence(dict_conn, db_url):
    threads = []
    effects = []

    def add_points(payload, ctx):
        threads.append(threading.get_ident())
        with ctx.transaction() as tx:
            tx.execute("INSERT INTO points (user_id, delivery) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                       (payload["user"], ctx.delivery_hash))
        effects.append(payload["user"])
        return payload["user"] * 10

    register(Consumer("points", add_points))
    dict_conn.execute("CREATE TABLE points (user_id int, delivery text UNIQUE)")
    first = enqueue(dict_conn, "points", {"user": 1})
    enqueue(dict_conn, "points", {"user": 2})
    later = enqueue(dict_conn, "points", {"user": 3}, delay=3600)
    dict_conn.commit()
    tq = TestQueue(db_url)
    active_before = threading.active_count()
    assert tq.run_one("points") == 10
    assert tq.rerun("points", first.id) == 10  # a second run of a finished job...
    assert dict_conn.execute("SELECT count(*) AS n FROM points WHERE user_id = 1").fetchone()["n"] == 1
    assert tq.drain("points") == 1  # the delayed job is not ready
    with pytest.raises(LookupError):
        tq.run_one("points")
    assert tq.run_job("points", later.id).result == 30  # a chosen job runs now, whatever its run_at
    assert set(threads) == {threading.get_ident()} and threading.active_count() == active_before
    assert effects == [1, 1, 2, 3]
    with pytest.raises(InvalidTransition, match="not done"):
        enqueued = enqueue(dict_conn, "points", {"user": 4})
        dict_conn.commit()
        tq.rerun("points", enqueued.id)


def test_run_one_asserts_success_and_records_the_failed_attempt(dict_conn, db_url):
    register(Consumer("broken", lambda p: 1 / 0, max_attempts=5))
    job = enqueue(dict_conn, "broken", {})
    dict_conn.commit()
    with pytest.raises(JobFailed, match="ZeroDivisionError"):
        TestQueue(db_url).run_one("broken")
    failed = get_job(dict_conn, job.id)
    assert (failed.status, failed.attempts) == (JobStatus.RETRYING, 1)


# ---------------------------------------------------------------- CLI


def _cli(db_url, *args):
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cli_jobs_errors_retry_queues_and_stats(dict_conn, db_url):
    register(Consumer("cli_q", lambda p: (_ for _ in ()).throw(RuntimeError("smtp refused")) if p["bad"] else None,
                      max_attempts=1))
    bad = enqueue(dict_conn, "cli_q", {"bad": True})
    enqueue_many(dict_conn, "cli_q", [{"bad": False}] * 2)
    enqueue(dict_conn, "idle_q", {})
    dict_conn.commit()
    TestQueue(db_url).drain("cli_q", expect_success=False)
    assert status_of(db_url, bad.id) == "dead"

    table = _cli(db_url, "jobs", "errors", "cli_q")
    assert "last_error" in table.splitlines()[0]
    [line] = [ln for ln in table.splitlines() if ln.split()[:1] == [str(bad.id)]]
    assert "dead" in line and "RuntimeError: smtp refused" in line
    errors = json.loads(_cli(db_url, "jobs", "errors", "cli_q", "--json"))
    assert [(e["id"], e["status"]) for e in errors] == [(bad.id, "dead")]

    assert f"job {bad.id} (cli_q): queued" in _cli(db_url, "jobs", "retry", str(bad.id))
    assert status_of(db_url, bad.id) == "queued"

    queues = _cli(db_url, "queues")
    header, _, *rows = queues.splitlines()
    assert header.split()[:3] == ["queue", "paused", "waiting"]
    by_queue = {r.split()[0]: dict(zip(header.split(), r.split(), strict=True)) for r in rows}
    assert by_queue["cli_q"]["done"] == "2" and by_queue["cli_q"]["queued"] == "1"
    assert by_queue["idle_q"]["queued"] == "1"

    stats = _cli(db_url, "stats")
    assert "retries (last" in stats and "processing time in ms" in stats
    assert any(ln.split()[:2] == ["cli_q", "2"] for ln in stats.splitlines())
    as_json = json.loads(_cli(db_url, "stats", "--json"))
    assert [r["queue"] for r in as_json["retries"]] == ["cli_q"]

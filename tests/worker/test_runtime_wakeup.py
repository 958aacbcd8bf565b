"""Fast wake-up with NOTIFY, polling as the truth, scheduling and priority (behaviours 5 and 6)."""

from __future__ import annotations

import random
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from outboxq import enqueue, enqueue_many
from outboxq.testing import TestQueue
from outboxq.workers.registry import Consumer, register
from outboxq.workers.runner import Worker
from tests.handlers_runtime import isolated_registry  # noqa: F401
from tests.support import wait_for


def _measure_latencies(db_url, worker, started, samples, write=enqueue):
    latencies = []
    with psycopg.connect(db_url) as conn:
        for i in range(samples):
            time.sleep(0.05)  # let the worker go idle again
            t0 = time.monotonic()
            write(conn, worker_queue(worker), {"i": i})
            conn.commit()
            wait_for(lambda i=i: i in started, timeout=10, interval=0.001)
            latencies.append(started[i] - t0)
    return latencies


def worker_queue(worker):
    return next(iter(worker.consumers))


def test_idle_worker_with_long_poll_interval_starts_a_new_job_within_a_second_thanks_to_notify(db_url):
    started: dict[int, float] = {}
    consumer = Consumer("wake", lambda p, ctx: started.setdefault(p["i"], time.monotonic()))
    worker = Worker([consumer], url=db_url, poll_interval=30.0).start()
    try:
        assert worker.listener.ready.wait(5)
        time.sleep(0.2)  # the start-up claim found nothing: the dispatcher now sleeps up to 30 s
        latencies = _measure_latencies(db_url, worker, started, 10)
    finally:
        worker.stop(timeout=5)
    ms = sorted(x * 1000 for x in latencies)
    print(f"\nNOTIFY wake-up latency (enqueue+commit -> handler start), ms: p50 {statistics.median(ms):.1f}"
          f" max {ms[-1]:.1f}")
    assert max(latencies) < 1.0  # far below the 30 s poll interval


def _insert_without_notification(conn, queue, payload):
    """A job written by plain SQL (not by enqueue): no notification goes out for it."""
    conn.execute("INSERT INTO outboxq_jobs (queue, payload) VALUES (%s, %s)", (queue, Jsonb(payload)))


def test_enqueue_notifies_on_commit_only_and_a_plain_insert_does_not(db_url):
    """The statements that write jobs send the wake-up notification (delivered at COMMIT, never on rollback);
    a delayed job sends none."""
    with psycopg.connect(db_url, autocommit=True) as listener, psycopg.connect(db_url) as conn:
        listener.execute("LISTEN outboxq_jobs")
        enqueue(conn, "notified", {"i": 1})
        enqueue(conn, "later", {"i": 2}, delay=60)
        _insert_without_notification(conn, "silent", {"i": 3})
        assert [n.payload for n in listener.notifies(timeout=0.3, stop_after=1)] == []  # not committed yet
        conn.commit()
        assert [n.payload for n in listener.notifies(timeout=1, stop_after=1)] == ["notified"]
        assert [n.payload for n in listener.notifies(timeout=0.3, stop_after=1)] == []
        enqueue(conn, "rolled_back", {"i": 4})
        enqueue_many(conn, "many", [{"i": 5}, {"i": 6}])
        conn.rollback()
        enqueue_many(conn, "many", [{"i": 5}, {"i": 6}])
        conn.commit()
        assert [n.payload for n in listener.notifies(timeout=1, stop_after=1)] == ["many"]
        assert [n.payload for n in listener.notifies(timeout=0.3, stop_after=1)] == []


def test_worker_still_finds_jobs_by_polling_when_notifications_are_lost(db_url):
    started: dict[int, float] = {}
    consumer = Consumer("lost", lambda p, ctx: started.setdefault(p["i"], time.monotonic()))
    worker = Worker([consumer], url=db_url, poll_interval=0.5).start()
    try:
        assert worker.listener.ready.wait(5)
        latencies = _measure_latencies(db_url, worker, started, 4, write=_insert_without_notification)
    finally:
        worker.stop(timeout=5)
    print(f"\nno NOTIFY, poll_interval 0.5 s: latencies ms {[round(x * 1000) for x in latencies]}")
    assert max(latencies) < 0.5 + 1.5  # at most one poll interval (plus generous slack)


def test_delayed_and_scheduled_jobs_do_not_run_before_their_time(db_url):
    started = {}
    consumer = Consumer("later", lambda p, ctx: started.setdefault(p["name"], time.monotonic()))
    worker = Worker([consumer], url=db_url, poll_interval=0.05).start()
    try:
        with psycopg.connect(db_url, row_factory=dict_row) as conn:
            t0 = time.monotonic()
            delayed = enqueue(conn, "later", {"name": "delayed"}, delay=0.8)
            scheduled = enqueue(conn, "later", {"name": "scheduled"},
                                run_at=datetime.now(UTC) + timedelta(seconds=0.8))
            now_job = enqueue(conn, "later", {"name": "now"})
            conn.commit()
            wait_for(lambda: len(started) == 3, timeout=10)
            rows = conn.execute("SELECT id, run_at, attempt_started_at FROM outboxq_jobs ORDER BY id").fetchall()
    finally:
        worker.stop(timeout=5)
    assert started["now"] - t0 < 0.5
    for name in ("delayed", "scheduled"):
        waited = started[name] - t0
        assert 0.75 <= waited < 0.8 + 2.0, (name, waited)
    for row in rows:  # the database's own clock agrees: no attempt began before run_at
        assert row["attempt_started_at"] >= row["run_at"]
    assert {r["id"] for r in rows} == {delayed.id, scheduled.id, now_job.id}


def test_lower_priority_numbers_run_first_within_a_queue(db_url):
    ran = []
    gate = threading.Event()

    def handler(payload, ctx):
        gate.wait(5)
        ran.append(payload["p"])

    priorities = [5, 3, 9, -2, 0, 3, 7, -2, 1, 5] * 3
    random.Random(3).shuffle(priorities)
    with psycopg.connect(db_url) as conn:
        for p in priorities:
            enqueue(conn, "prio", {"p": p}, priority=p)
        conn.commit()
    worker = Worker([Consumer("prio", handler)], url=db_url, concurrency=1, batch_size=100,
                    poll_interval=0.05).start()
    try:
        gate.set()
        wait_for(lambda: len(ran) == len(priorities))
    finally:
        worker.stop(timeout=5)
    assert ran == sorted(priorities)


def test_testing_helpers_also_run_jobs_in_priority_then_run_at_order(db_url):
    ran = []
    register(Consumer("prio_tq", lambda p: ran.append(p["n"])))
    with psycopg.connect(db_url) as conn:
        enqueue(conn, "prio_tq", {"n": "low-first-enqueued"}, priority=10)
        enqueue(conn, "prio_tq", {"n": "urgent"}, priority=-5)
        enqueue(conn, "prio_tq", {"n": "normal-a"})
        enqueue(conn, "prio_tq", {"n": "normal-b"})
        conn.commit()
    assert TestQueue(db_url).drain("prio_tq") == 4
    assert ran == ["urgent", "normal-a", "normal-b", "low-first-enqueued"]

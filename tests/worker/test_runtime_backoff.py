"""Per-queue backoff while a downstream is down (behaviour 4), and the retry policy."""

from __future__ import annotations

import random
import threading
import time

import psycopg
from psycopg.rows import dict_row

import tests.handlers_runtime  # noqa: F401 - registers its consumers
from outboxq import enqueue_many
from outboxq.queue.backoff import RetryPolicy
from outboxq.settings import Settings
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.support import wait_for


def test_failing_queue_retries_one_at_a_time_while_another_queue_keeps_running_then_eagerly_after_success(db_url):
    downstream_up = threading.Event()
    lock = threading.Lock()
    state = {"running_retries": 0, "peak_down": 0, "peak_up": 0, "retries_while_down": 0}
    other_done_while_down = []

    def call_downstream(payload, ctx):
        up_at_start = downstream_up.is_set()
        with lock:
            if ctx.attempt > 1:
                state["running_retries"] += 1
                peak = "peak_up" if up_at_start else "peak_down"
                state[peak] = max(state[peak], state["running_retries"])
                if not up_at_start:
                    state["retries_while_down"] += 1
        try:
            time.sleep(0.1)  # long enough for parallel retries to overlap, were they allowed
            if not downstream_up.is_set():
                raise ConnectionError("downstream is down")
        finally:
            with lock:
                if ctx.attempt > 1:
                    state["running_retries"] -= 1

    def other(payload, ctx):
        time.sleep(0.01)
        if not downstream_up.is_set():
            other_done_while_down.append(payload["i"])

    down = Consumer("downstream", call_downstream, max_attempts=0, backoff_base=0.02, backoff_max=0.02, jitter=0)
    healthy = Consumer("healthy", other)
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "downstream", [{"i": i} for i in range(6)])
        conn.commit()
    worker = Worker([down, healthy], url=db_url, concurrency=8, poll_interval=0.05, run_maintenance=False).start()
    try:
        with psycopg.connect(db_url) as conn:
            enqueue_many(conn, "healthy", [{"i": i} for i in range(40)])
            conn.commit()
        wait_for(lambda: state["retries_while_down"] >= 6 and len(other_done_while_down) == 40, timeout=30)
        with psycopg.connect(db_url, row_factory=dict_row) as c:
            queue_row = c.execute("SELECT failing_since IS NOT NULL AS failing, consecutive_failures "
                                  "FROM outboxq_queues WHERE queue = 'downstream'").fetchone()
        downstream_up.set()
        with psycopg.connect(db_url, autocommit=True) as c:
            wait_for(lambda: c.execute("SELECT count(*) FROM outboxq_jobs WHERE queue = 'downstream' "
                                       "AND status = 'done'").fetchone()[0] == 6, timeout=30)
            after = c.execute("SELECT failing_since, consecutive_failures FROM outboxq_queues "
                              "WHERE queue = 'downstream'").fetchone()
    finally:
        downstream_up.set()
        worker.stop(timeout=5)
    # While down: every retry of the queue ran alone, and the other queue finished all its jobs.
    assert state["peak_down"] == 1
    assert sorted(other_done_while_down) == list(range(40))
    assert queue_row["failing"] and queue_row["consecutive_failures"] >= 6 + 5  # first attempts, then retries
    # After one success the queue is healthy again and its remaining retries run together.
    assert state["peak_up"] >= 2
    assert after == (None, 0)


def test_retry_policy_grows_exponentially_with_jitter_caps_and_zero_means_forever():
    policy = RetryPolicy(max_attempts=5, backoff_base=2.0, backoff_max=30.0, jitter=0.0)
    assert [policy.delay(a) for a in range(1, 7)] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert not policy.is_exhausted(4) and policy.is_exhausted(5)
    assert policy.is_exhausted(3, max_attempts=3)  # the job's own max_attempts wins
    forever = RetryPolicy(max_attempts=0)
    assert not forever.is_exhausted(10**9)
    jittered = RetryPolicy(backoff_base=4.0, backoff_max=1000.0, jitter=0.25)
    rng = random.Random(7)
    delays = [jittered.delay(3, rng) for _ in range(200)]  # 16 s ± 25 %
    assert all(12.0 <= d <= 20.0 for d in delays)
    assert len({round(d, 6) for d in delays}) > 100  # spread out, not in lockstep
    assert RetryPolicy(backoff_base=1.0, backoff_max=10.0).delay(10_000) <= 10.0  # no overflow


def test_consumer_options_override_the_settings_defaults():
    settings = Settings(max_attempts=7, backoff_base=3.0, backoff_max=99.0, backoff_jitter=0.1, lease_s=20,
                        max_execute_s=50)
    plain = Consumer("q", lambda p: None)
    assert plain.retry_policy(settings) == RetryPolicy(7, 3.0, 99.0, 0.1)
    assert (plain.effective_lease_s(settings), plain.effective_max_execute_s(settings)) == (20, 50)
    custom = Consumer("q", lambda p: None, max_attempts=0, backoff_base=1.0, jitter=0.0, lease_s=5)
    assert custom.retry_policy(settings) == RetryPolicy(0, 1.0, 99.0, 0.0)
    assert custom.effective_lease_s(settings) == 5

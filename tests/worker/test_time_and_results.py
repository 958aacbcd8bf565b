"""Snooze, timeouts that stop, stored results and progress, on a real PostgreSQL with in-process workers."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from psycopg.rows import dict_row

from outboxq import JobStatus, LeaseLost, Snooze, enqueue, get_job
from outboxq.errors import InvalidInput
from outboxq.workers.registry import Consumer, register
from outboxq.workers.runner import Worker
from tests.support import status_of, wait_for


def _enqueue(url, queue, payload=None, **options):
    with psycopg.connect(url) as c:
        job = enqueue(c, queue, payload if payload is not None else {}, **options)
        c.commit()
    return job.id


def _job(url, job_id):
    with psycopg.connect(url) as c:
        return get_job(c, job_id)


def _history(url, job_id):
    with psycopg.connect(url, row_factory=dict_row) as c:
        return c.execute("SELECT attempt, error, kind, worker_id FROM outboxq_job_errors WHERE job_id = %s "
                         "ORDER BY id",
                         (job_id,)).fetchall()


def test_snoozing_twice_with_max_attempts_1_then_succeeding_ends_done(db_url):
    runs = []

    def sleepy(payload, ctx):
        runs.append((ctx.attempt, time.monotonic()))
        if len(runs) <= 2:
            raise Snooze(0.3)

    worker = Worker([Consumer("sleepy", sleepy, max_attempts=1)], url=db_url, poll_interval=0.05,
                    run_maintenance=False).start()
    try:
        job_id = _enqueue(db_url, "sleepy")
        wait_for(lambda: status_of(db_url, job_id) == "done", timeout=15)
    finally:
        worker.stop(timeout=5)
    job = _job(db_url, job_id)
    assert job.status is JobStatus.DONE and job.attempts == 1 and job.snoozes == 2
    assert [a for a, _ in runs] == [1, 1, 1]  # a snooze gives its attempt back
    assert runs[1][1] - runs[0][1] >= 0.25 and runs[2][1] - runs[1][1] >= 0.25
    assert _history(db_url, job_id) == [{"attempt": 1, "error": "snoozed for 0.3 s", "kind": "snooze",
                                         "worker_id": worker.worker_id}] * 2  # (the dashboard's timeline)
    assert job.worker_id == worker.worker_id and job.attempt_started_at >= job.started_at


def test_snooze_needs_a_number_of_seconds():
    with pytest.raises(InvalidInput):
        Snooze(-1)


def test_return_value_is_stored_as_the_result_and_read_back_in_python_and_http(db_url):
    from tests.api_support import api_client

    def compute(payload, ctx):
        return {"sum": payload["a"] + payload["b"], "items": [1, 2]}

    def in_transaction(payload, ctx):
        with ctx.transaction() as conn:
            conn.execute("SELECT 1")
        return "written"

    worker = Worker([Consumer("compute", compute), Consumer("tx", in_transaction)], url=db_url,
                    poll_interval=0.05, run_maintenance=False).start()
    try:
        job_id = _enqueue(db_url, "compute", {"a": 2, "b": 3})
        tx_id = _enqueue(db_url, "tx")
        wait_for(lambda: status_of(db_url, job_id) == "done" and status_of(db_url, tx_id) == "done")
    finally:
        worker.stop(timeout=5)
    assert _job(db_url, job_id).result == {"sum": 5, "items": [1, 2]}
    assert _job(db_url, tx_id).result == "written"
    with api_client(db_url, scope="read") as api:
        body = api.get(f"/v1/jobs/{job_id}").json()
    assert body["result"] == {"sum": 5, "items": [1, 2]}


def test_a_return_value_that_is_not_json_fails_the_attempt_with_a_clear_error(db_url):
    worker = Worker([Consumer("odd", lambda payload: {1, 2}, max_attempts=1)], url=db_url, poll_interval=0.05,
                    run_maintenance=False).start()
    try:
        job_id = _enqueue(db_url, "odd")
        wait_for(lambda: status_of(db_url, job_id) == "dead")
    finally:
        worker.stop(timeout=5)
    job = _job(db_url, job_id)
    assert "result not storable: the result is not JSON" in job.last_error and job.result is None


def test_progress_is_visible_while_the_job_runs(db_url):
    from tests.api_support import api_client

    halfway, finish = threading.Event(), threading.Event()

    def long_job(payload, ctx):
        ctx.set_progress(0.5, "half the rows")
        halfway.set()
        finish.wait(10)
        with pytest.raises(InvalidInput):
            ctx.set_progress(1.5)
        ctx.set_progress(1.0)

    worker = Worker([Consumer("long", long_job)], url=db_url, poll_interval=0.05, run_maintenance=False).start()
    try:
        job_id = _enqueue(db_url, "long")
        assert halfway.wait(10)
        job = _job(db_url, job_id)
        assert job.status is JobStatus.RUNNING and job.progress == 0.5 and job.progress_message == "half the rows"
        with api_client(db_url, scope="read") as api:
            body = api.get(f"/v1/jobs/{job_id}").json()
        assert body["progress"] == 0.5 and body["progress_message"] == "half the rows"
        finish.set()
        wait_for(lambda: status_of(db_url, job_id) == "done")
    finally:
        finish.set()
        worker.stop(timeout=5)
    assert _job(db_url, job_id).progress == 1.0


def test_a_sync_handler_past_its_timeout_is_failed_fenced_and_its_slot_reused(db_url):
    late_write: list[BaseException | None] = []
    stuck_done = threading.Event()
    ran: list[int] = []

    def slow(payload, ctx):
        if payload.get("stuck"):
            time.sleep(3.0)  # cannot be interrupted
            try:
                with ctx.transaction() as conn:
                    conn.execute("SELECT 1")
                late_write.append(None)
            except LeaseLost as exc:
                late_write.append(exc)
            stuck_done.set()
        else:
            ran.append(ctx.job_id)

    worker = Worker([Consumer("slow", slow, timeout=1.0, max_attempts=1)], url=db_url, concurrency=1,
                    poll_interval=0.05, run_maintenance=False).start()
    try:
        started = time.monotonic()
        stuck_id = _enqueue(db_url, "slow", {"stuck": True})
        wait_for(lambda: status_of(db_url, stuck_id) == "dead", timeout=10)
        failed_after = time.monotonic() - started
        other_id = _enqueue(db_url, "slow", {"stuck": False})
        # concurrency=1 and the stuck handler still sleeps: the other job runs on the new handler thread.
        wait_for(lambda: status_of(db_url, other_id) == "done", timeout=10)
        assert not stuck_done.is_set()
        assert stuck_done.wait(10)
    finally:
        worker.stop(timeout=5)
    assert 1.0 <= failed_after < 3.0, failed_after
    assert isinstance(late_write[0], LeaseLost)  # its late write was refused
    job = _job(db_url, stuck_id)
    assert job.status is JobStatus.DEAD and "timed out after 1 s" in job.last_error
    assert ran == [other_id]


def test_an_async_handler_past_its_timeout_is_cancelled_and_retried(db_url):
    cancelled = []

    async def hang(payload, ctx):
        try:
            if ctx.attempt == 1:
                await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(ctx.attempt)
            raise

    worker = Worker([Consumer("hang", hang, timeout=0.5, backoff_base=0.1, jitter=0.0)], url=db_url,
                    poll_interval=0.05, run_maintenance=False).start()
    try:
        job_id = _enqueue(db_url, "hang")
        wait_for(lambda: status_of(db_url, job_id) == "done", timeout=15)
    finally:
        worker.stop(timeout=5)
    job = _job(db_url, job_id)
    assert cancelled == [1] and job.attempts == 2
    assert "timed out after 0.5 s" in _history(db_url, job_id)[0]["error"]


def test_timeout_is_validated():
    with pytest.raises(InvalidInput, match="timeout"):
        register(Consumer("bad-timeout", lambda payload: None, timeout=-1))


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_cancelling_a_running_job_stops_it_at_once(db_url, kind):
    from outboxq.queue import admin

    started, handler_ended = threading.Event(), threading.Event()
    late_write: list[BaseException | None] = []

    async def async_hang(payload, ctx):
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            handler_ended.set()

    def sync_hang(payload, ctx):
        started.set()
        time.sleep(2.0)
        try:
            with ctx.transaction() as conn:
                conn.execute("SELECT 1")
            late_write.append(None)
        except LeaseLost as exc:
            late_write.append(exc)
        handler_ended.set()

    handler = async_hang if kind == "async" else sync_hang
    # The lease (60 s) makes the regular heartbeat come every 20 s: only the cancel notice can be this quick.
    worker = Worker([Consumer("hang", handler, lease_s=60)], url=db_url, poll_interval=0.05, concurrency=1,
                    run_maintenance=False).start()
    try:
        job_id = _enqueue(db_url, "hang")
        assert started.wait(10)
        requested = time.monotonic()
        with psycopg.connect(db_url) as c:
            admin.cancel_job(c, job_id)
            c.commit()
        wait_for(lambda: status_of(db_url, job_id) == "cancelled", timeout=10)
        assert time.monotonic() - requested < 2.0
        assert handler_ended.wait(10)
    finally:
        worker.stop(timeout=5)
    if kind == "sync":
        assert isinstance(late_write[0], LeaseLost)

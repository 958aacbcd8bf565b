"""Stuck handlers: the handler's own stack is logged at ERROR once per max_execute_s crossing (behaviour 2)."""

from __future__ import annotations

import asyncio
import logging
import threading

import psycopg
import pytest
from psycopg.rows import dict_row

import tests.handlers_runtime  # noqa: F401 - registers its consumers
from outboxq import enqueue
from outboxq.workers import executor
from outboxq.workers.executor import AsyncLoop
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.support import status_of, wait_for


def _stuck_records(caplog):
    return [r for r in caplog.records if r.levelno == logging.ERROR and "handler's stack" in r.getMessage()]


@pytest.mark.parametrize("is_async", [False, True])
def test_stuck_handler_stack_is_logged_at_error_with_the_handlers_own_frames(db_url, caplog, is_async):
    release = threading.Event()
    if is_async:
        async def slow_report_generator_waits_on_downstream(payload, ctx):
            while not release.is_set():
                await asyncio.sleep(0.01)
        handler = slow_report_generator_waits_on_downstream
    else:
        def slow_report_generator_waits_on_downstream(payload, ctx):
            release.wait(10)
        handler = slow_report_generator_waits_on_downstream

    consumer = Consumer("reports", handler, max_execute_s=0.4)
    with psycopg.connect(db_url) as conn:
        job = enqueue(conn, "reports", {})
        conn.commit()
    worker = Worker([consumer], url=db_url, poll_interval=0.05, run_maintenance=False)
    with caplog.at_level(logging.ERROR, logger="outboxq.worker"):
        worker.start()
        try:
            wait_for(lambda: _stuck_records(caplog), timeout=10)
            release.set()
            wait_for(lambda: status_of(db_url, job.id) == "done")
        finally:
            release.set()
            worker.stop(timeout=5)
    records = _stuck_records(caplog)
    message = records[0].getMessage()
    assert "slow_report_generator_waits_on_downstream" in message  # the handler's frame, not the worker's
    assert "_heartbeat_loop" not in message and "_dispatcher_loop" not in message
    assert records[0].job_id == job.id and records[0].queue == "reports"
    assert "max_execute_s=0.4" in message
    assert status_of(db_url, job.id) == "done"  # logged, never killed


def test_stuck_stack_is_logged_once_per_threshold_crossing(db_url, caplog):
    """Clock injected into report_stuck: one ERROR at each multiple of max_execute_s, none in between."""
    release = threading.Event()
    running = threading.Event()

    def waits_for_a_lock_forever(payload, ctx):
        running.set()
        release.wait(10)

    consumer = Consumer("stuck", waits_for_a_lock_forever, max_execute_s=10.0)
    worker = Worker([consumer], url=db_url, listen=False, run_maintenance=False)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        enqueue(conn, "stuck", {})
        conn.commit()
        [job] = worker.claim(conn, consumer, 1)
    thread = threading.Thread(target=executor.execute, args=(job, None))
    thread.start()
    try:
        running.wait(5)
        start = job.started_monotonic
        with caplog.at_level(logging.ERROR, logger="outboxq.worker"):
            logged = [executor.report_stuck(job, start + t) for t in (1.0, 9.9, 10.1, 12.0, 19.9, 20.5, 21.0, 45.0)]
    finally:
        release.set()
        thread.join(5)
    assert logged == [False, False, True, False, False, True, False, True]
    records = _stuck_records(caplog)
    assert len(records) == 3
    assert all("waits_for_a_lock_forever" in r.getMessage() for r in records)
    assert "running for 45.0 s" in records[-1].getMessage()


def test_async_handler_stack_shows_the_whole_await_chain():
    """An async handler suspended deep in awaits: the dump names every coroutine down to the innermost."""
    loop = AsyncLoop()
    release = threading.Event()

    async def innermost_wait():
        while not release.is_set():
            await asyncio.sleep(0.01)

    async def outer_handler_awaiting_helper(payload, ctx):
        await innermost_wait()

    consumer = Consumer("deep", outer_handler_awaiting_helper)
    job = executor.ClaimedJob(id=1, queue="deep", key=None, payload={}, attempts=1, max_attempts=1,
                              lease_token=None, context=None, consumer=consumer)
    runner = threading.Thread(target=loop.run, args=(job, lambda: outer_handler_awaiting_helper({}, None)))
    runner.start()
    try:
        wait_for(lambda: job.task is not None, timeout=5)
        stack = wait_for(lambda: (s := executor.handler_stack(job)) and "innermost_wait" in s and s, timeout=5)
    finally:
        release.set()
        runner.join(5)
        loop.close()
    assert stack.index("outer_handler_awaiting_helper") < stack.index("innermost_wait")

"""Each room of a worker (dispatcher, completer, heartbeat, scheduler, listener, maintenance) survives an error
of its loop, logged with its traceback, and goes on working; a room that fails beyond recovery stops the worker,
its health says which room died, and `outboxq worker` exits non-zero for its supervisor to restart it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from prometheus_client import generate_latest

from outboxq import consumer, enqueue_many
from outboxq.errors import WorkerFailed
from outboxq.workers import rooms as worker_rooms
from outboxq.workers.dispatcher import Dispatcher
from outboxq.workers.maintenance.leader import leader_of
from outboxq.workers.periodic import Schedule
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from outboxq.workers.scheduler import Scheduler
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
# Set for a worker process that imports this module as its handler module: its dispatcher fails every time.
FAILING_DISPATCHER_ENV = "OUTBOXQ_TEST_FAILING_DISPATCHER"


@consumer("rooms-fatal")
def never_runs(payload) -> None:
    """The consumer of the worker process whose dispatcher fails beyond recovery."""


if os.environ.get(FAILING_DISPATCHER_ENV):  # (only in that process, never in the test run's)
    def _claim_fails(*args, **kwargs):
        raise RuntimeError("injected: the claim fails every time")

    Dispatcher.claim = _claim_fails  # type: ignore[method-assign]
    worker_rooms.ROOM_RETRY_DELAY_S = 0.05


class Injected(RuntimeError):
    """The error injected into a room's loop."""


def raise_once(original):
    """`original`, except that its first call raises Injected; .calls counts the calls after that one."""
    def once(*args, **kwargs):
        once.calls += 1
        if once.calls == 1:
            raise Injected("injected once")
        return original(*args, **kwargs)
    once.calls = 0
    return once


@pytest.fixture(autouse=True)
def _short_pause(monkeypatch):
    monkeypatch.setattr(worker_rooms, "ROOM_RETRY_DELAY_S", 0.05)


@pytest.fixture
def ran():
    return []


@pytest.fixture
def worker_of(db_url, ran):
    """Make a worker of queue "rooms" (its handler records the jobs it runs, sleeping payload["seconds"]);
    stopped at the end of the test."""
    workers = []

    def make(start=True, lease_s=None, **options) -> Worker:
        def handler(payload, ctx):
            time.sleep(payload.get("seconds", 0))
            ran.append(ctx.job_id)

        options = {"poll_interval": 0.2, "concurrency": 2, **options}
        worker = Worker([Consumer("rooms", handler, lease_s=lease_s)], url=db_url, **options)
        workers.append(worker)
        return worker.start() if start else worker

    yield make
    for worker in workers:
        worker.stop(timeout=5)


def _run_jobs(db_url, ran, count=3, seconds=0.0, timeout=10.0) -> None:
    """Enqueue `count` jobs of "rooms" and wait until the worker ran and completed every one."""
    with psycopg.connect(db_url) as conn:
        ids = [j.id for j in enqueue_many(conn, "rooms", [{"seconds": seconds}] * count)]
    wait_for(lambda: set(ids) <= set(ran) and _done(db_url, ids), timeout=timeout)


def _done(db_url, ids) -> bool:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT count(*) FROM outboxq_jobs WHERE id = ANY(%s) AND status = 'done'",
                            (ids,)).fetchone()[0] == len(ids)


def _assert_survived(worker: Worker, room: str, caplog) -> None:
    """The room failed once, logged it at ERROR with its traceback, and is alive; the worker is healthy."""
    logged = [r for r in caplog.records if f"worker room {room} failed" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert logged[0].levelno == logging.ERROR and logged[0].exc_info[0] is Injected
    health = worker.health()
    assert health["healthy"] and health["rooms"][room] == {
        "alive": True, "failures": 1, "last_error": "Injected: injected once"}


def test_the_dispatcher_survives_an_error_and_claims_on(db_url, ran, worker_of, caplog):
    worker = worker_of(start=False)
    worker.dispatcher.claim = raise_once(worker.dispatcher.claim)  # its first claim fails
    worker.start()
    wait_for(lambda: worker.dispatcher.claim.calls >= 2, timeout=10)
    _run_jobs(db_url, ran)
    _assert_survived(worker, "dispatcher", caplog)


def test_the_completer_survives_an_error_and_writes_on(db_url, ran, worker_of, caplog):
    worker = worker_of()
    # After the completer's first write, its loop fails (counting the written outcomes): it runs again.
    worker.metrics.jobs_finished = raise_once(worker.metrics.jobs_finished)
    _run_jobs(db_url, ran, count=1)
    wait_for(lambda: worker.health()["rooms"]["completer"]["failures"] == 1, timeout=5)
    _run_jobs(db_url, ran)
    _assert_survived(worker, "completer", caplog)
    # (counted right after the commit that the jobs' rows show: a moment later than the rows)
    wait_for(lambda: worker.stats["completed"] == 4, timeout=5)
    assert worker.stats["fenced"] == 0


def test_the_heartbeat_survives_an_error_and_keeps_renewing_leases(db_url, ran, worker_of, caplog):
    worker = worker_of(start=False, lease_s=1.0)
    worker.heartbeat._check_stuck = raise_once(worker.heartbeat._check_stuck)
    worker.start()
    wait_for(lambda: worker.heartbeat._check_stuck.calls >= 2, timeout=5)
    # A job that runs for more than twice its lease completes in its first attempt: the heartbeat renewed it.
    _run_jobs(db_url, ran, count=1, seconds=2.5)
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT attempts FROM outboxq_jobs").fetchone()[0] == 1
    assert worker.stats["fenced"] == 0
    _assert_survived(worker, "heartbeat", caplog)


def test_the_scheduler_survives_an_error_and_schedules_fire_on(db_url, ran, worker_of, caplog, monkeypatch):
    monkeypatch.setattr(Scheduler, "tick", raise_once(Scheduler.tick))  # its first tick fails
    schedule = Schedule(name="rooms-beat", queue="rooms", every=timedelta(seconds=1), payload={})
    worker = worker_of(schedules=[schedule])
    wait_for(lambda: len(ran) >= 2, timeout=10)
    _assert_survived(worker, "scheduler", caplog)


def test_the_listener_survives_an_error_and_notifications_wake_the_worker(db_url, ran, worker_of, caplog):
    worker = worker_of(poll_interval=30.0)  # only a notification wakes it in time
    wait_for(worker.listener.ready.is_set, timeout=5)
    on_notify = worker.listener.on_notify

    def fails_on_a_notification(queue):
        if queue != "*" and not fails_on_a_notification.failed:
            fails_on_a_notification.failed = True
            raise Injected("injected once")
        on_notify(queue)
    fails_on_a_notification.failed = False
    worker.listener.on_notify = fails_on_a_notification

    _run_jobs(db_url, ran, count=1)  # its notification fails the listener; its reconnect wakes the worker
    wait_for(lambda: worker.health()["rooms"]["listener"]["failures"] == 1, timeout=5)
    wait_for(worker.listener.ready.is_set, timeout=5)
    _run_jobs(db_url, ran, timeout=5)  # woken by its notification: the next poll would be 30 s away
    _assert_survived(worker, "listener", caplog)


def test_maintenance_survives_an_error_and_leads_and_rescues_on(db_url, worker_of, caplog):
    worker = worker_of()
    wait_for(lambda: worker.maintenance.is_leader, timeout=5)
    rescue = next(s for s in worker.maintenance.services if s.name == "rescue")
    rescue.run = raise_once(rescue.run)
    wait_for(lambda: rescue.run.calls >= 3, timeout=5)  # failed once, then ran again (twice)
    assert worker.maintenance.is_leader  # its connection was closed: it took the lock again on a new one
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert leader_of(conn, "public") is not None
    _assert_survived(worker, "maintenance", caplog)


def test_a_fatal_error_stops_the_worker_and_its_health_shows_the_room_dead(worker_of, caplog):
    worker = worker_of(start=False)

    def out_of_memory(now):
        raise MemoryError("injected")
    worker.heartbeat._check_stuck = out_of_memory
    failed: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            failed.append(exc)
    runner = threading.Thread(target=run)
    runner.start()
    wait_for(worker.state.rooms.fatal.is_set, timeout=5)
    health = worker.health()
    assert not health["healthy"] and health["rooms"]["heartbeat"]["alive"] is False
    assert health["rooms"]["dispatcher"]["alive"] is True
    scraped = generate_latest(worker.metrics.registry).decode()
    assert 'outboxq_worker_room_up{room="heartbeat"} 0.0' in scraped
    assert 'outboxq_worker_room_up{room="dispatcher"} 1.0' in scraped
    runner.join(timeout=15)
    assert not runner.is_alive() and worker.state.stopping.is_set()
    assert len(failed) == 1 and isinstance(failed[0], WorkerFailed), failed
    assert "heartbeat failed beyond recovery (MemoryError: injected)" in str(failed[0])
    fatal = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert "worker room heartbeat failed" in fatal[0].getMessage() and fatal[0].exc_info[0] is MemoryError


def test_a_room_failing_again_and_again_makes_outboxq_worker_exit_non_zero(db_url):
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT), FAILING_DISPATCHER_ENV: "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "outboxq.cli", "--log-level", "ERROR", "worker", "--processes", "1",
         "--handlers", "tests.worker.test_rooms_survive", "--poll-interval", "0.2"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "worker room dispatcher failed (RuntimeError: injected: the claim fails every time); it goes on" \
        in proc.stderr
    assert "5 failures within 60 s: the worker stops" in proc.stderr
    assert "stopped: its dispatcher failed beyond recovery (RuntimeError: injected" in proc.stderr

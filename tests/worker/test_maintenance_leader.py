"""Maintenance runs on one leader worker at a time, on its own thread and connection, never in the way of the
heartbeats: a long prune cannot let a live job's lease lapse."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from outboxq import Worker, consumer, enqueue
from outboxq.workers.maintenance.leader import leader_of
from outboxq.workers.registry import get_consumer
from tests.support import status_of, wait_for

HELD = threading.Event()
RUNS: list[int] = []


@consumer("leader-idle")
def idle(payload) -> None:
    """A consumer that does nothing: the workers of the hand-over test need one."""


@consumer("short-lease", lease_s=1.5)
def outlives_its_lease(payload, ctx) -> None:
    """Runs for several of its leases: only heartbeats keep the job this worker's."""
    RUNS.append(ctx.job_id)
    HELD.set()
    time.sleep(payload["seconds"])


def _leaders(workers: list[Worker]) -> list[Worker]:
    return [w for w in workers if w.maintenance is not None and w.maintenance.is_leader]


def _worker(db_url: str, queue: str, **options) -> Worker:
    return Worker([get_consumer(queue)], url=db_url, poll_interval=0.2, **options).start()


def test_one_worker_leads_and_another_takes_over_when_it_stops_or_loses_its_connection(db_url):
    workers = [_worker(db_url, "leader-idle") for _ in range(3)]
    try:
        wait_for(lambda: len(_leaders(workers)) == 1, timeout=10)
        time.sleep(1.0)  # the others keep trying; still only one leads
        assert len(_leaders(workers)) == 1
        first = _leaders(workers)[0]
        with psycopg.connect(db_url, autocommit=True) as conn:
            leader_pid = leader_of(conn, "public")
            assert leader_pid is not None

        first.stop(timeout=5)  # a worker that stops hands maintenance over
        started = time.monotonic()
        wait_for(lambda: len(_leaders(workers)) == 1 and _leaders(workers)[0] is not first, timeout=10)
        assert time.monotonic() - started < 5.0

        with psycopg.connect(db_url, autocommit=True) as conn:  # its connection dies, as a crashed host's would
            pid = leader_of(conn, "public")
            assert pid is not None and pid != leader_pid
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            started = time.monotonic()
            # The old leader believes it leads until its next statement fails; the lock is free at once.
            wait_for(lambda: leader_of(conn, "public") not in (None, pid) and len(_leaders(workers)) == 1,
                     timeout=10)
        assert time.monotonic() - started < 5.0
        assert _leaders(workers)[0] is not first
    finally:
        for w in workers:
            w.stop(timeout=5)


def test_a_long_prune_never_lets_a_running_jobs_lease_lapse(db_url):
    rows = 300_000
    with psycopg.connect(db_url) as conn:  # history older than retention, for the leader to prune
        conn.execute("""
            INSERT INTO outboxq_jobs (queue, status, payload, finished_at, created_at)
            SELECT 'history', 'done', '{}'::jsonb, now() - interval '30 days', now() - interval '30 days'
            FROM generate_series(1, %s)
        """, (rows,))
        job = enqueue(conn, "short-lease", {"seconds": 6.0})
        conn.commit()
    HELD.clear()
    RUNS.clear()
    # One worker both leads maintenance (it starts pruning at once) and runs the job on a 1.5 s lease: the
    # prune's batches and the lease renewals run side by side, each on its own thread and connection. Were a
    # renewal held back past the lease, this worker's own rescue pass would retry the job (a second run).
    worker = Worker([get_consumer("leader-idle"), get_consumer("short-lease")], url=db_url,
                    poll_interval=0.2).start()
    try:
        wait_for(lambda: worker.maintenance.is_leader, timeout=10)
        assert HELD.wait(10)
        with psycopg.connect(db_url, autocommit=True) as conn:
            def history() -> int:
                return conn.execute("SELECT count(*) FROM outboxq_jobs WHERE queue = 'history'").fetchone()[0]

            wait_for(lambda: history() < rows, timeout=20)  # the prune is under way while the job runs
            pruning_since = time.monotonic()
            wait_for(lambda: history() == 0, timeout=60)
            prune_s = time.monotonic() - pruning_since
        wait_for(lambda: status_of(db_url, job.id) == "done", timeout=30)
    finally:
        worker.stop(timeout=10)
    assert prune_s > 1.5, prune_s  # the prune outlasted the running job's lease
    assert RUNS == [job.id]  # ran once, never rescued and run again
    with psycopg.connect(db_url) as conn:
        attempts, errors = conn.execute(
            "SELECT attempts, (SELECT count(*) FROM outboxq_job_errors WHERE job_id = %(id)s) "
            "FROM outboxq_jobs WHERE id = %(id)s", {"id": job.id}).fetchone()
    assert (attempts, errors) == (1, 0)


@pytest.fixture(autouse=True)
def _quiet_threads():
    yield
    HELD.set()  # a handler still sleeping must not outlive its test by much

"""`outboxq worker --processes N` (workers/processes.py): N worker processes under one supervisor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg

from outboxq import enqueue_many
from tests.handlers_basic import RUNS_TABLE_DDL
from tests.support import stop_processes, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _supervisor(db_url, log_path, *extra):
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(
        [sys.executable, "-m", "outboxq.cli", "--log-level", "INFO", "worker", "--handlers", "tests.handlers_basic",
         "--queues", "slow", "--poll-interval", "0.2", "--batch-size", "2", *extra],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )


def _children(proc, n):
    return wait_for(lambda: (kids := psutil.Process(proc.pid).children()) and len(kids) == n and kids)


def _run_pids(db_url):
    with psycopg.connect(db_url) as conn:
        return {r[0] for r in conn.execute("SELECT DISTINCT pid FROM test_runs WHERE note = 'finished'")}


def _fill(db_url, n, seconds=0.3):
    with psycopg.connect(db_url) as conn:
        conn.execute(RUNS_TABLE_DDL)
        enqueue_many(conn, "slow", [{"seconds": seconds} for _ in range(n)])
        conn.commit()


def _gone(pids):
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_jobs_run_in_every_process_and_sigterm_stops_them_all(db_url, tmp_path):
    sup = _supervisor(db_url, tmp_path / "w.log", "--processes", "2", "--concurrency", "2")
    try:
        kids = {k.pid for k in _children(sup, 2)}
        # the jobs come once both children listen: on a loaded machine one child may start seconds after the
        # other, which would run all twelve by itself
        wait_for(lambda: all(any(f":{pid}:" in line and "started: queues" in line
                                 for line in (tmp_path / "w.log").read_text().splitlines()) for pid in kids),
                 timeout=60)
        _fill(db_url, 12)
        wait_for(lambda: len(_run_pids(db_url)) == 2, timeout=60)
        assert _run_pids(db_url) == kids  # the children ran the jobs, the supervisor none
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=60) == 0
        assert _gone(kids)
    finally:
        stop_processes(sup)


def test_a_child_that_dies_is_restarted(db_url, tmp_path):
    sup = _supervisor(db_url, tmp_path / "w.log", "--processes", "2", "--concurrency", "1")
    try:
        first = {k.pid for k in _children(sup, 2)}
        victim = sorted(first)[0]
        time.sleep(5.5)  # past the supervisor's failed-start window: this is a death at work, not at start
        os.kill(victim, signal.SIGKILL)
        now = wait_for(lambda: (pids := {k.pid for k in psutil.Process(sup.pid).children()})
                       and len(pids) == 2 and victim not in pids and pids, timeout=30)
        # (Filled once the new child's worker runs: on a loaded machine a child's start took 4-7 s, and the
        # surviving child had drained the 8 jobs by then.)
        [new_pid] = now - first
        wait_for(lambda: any(f":{new_pid}:" in line and "started: queues" in line
                             for line in (tmp_path / "w.log").read_text().splitlines()), timeout=60)
        _fill(db_url, 8)
        wait_for(lambda: _run_pids(db_url) & (now - first), timeout=60)  # the new child runs jobs
    finally:
        stop_processes(sup)


def test_children_stop_when_the_supervisor_is_killed(db_url, tmp_path):
    sup = _supervisor(db_url, tmp_path / "w.log", "--processes", "2")
    try:
        kids = {k.pid for k in _children(sup, 2)}
        os.kill(sup.pid, signal.SIGKILL)
        sup.wait(timeout=10)
        wait_for(lambda: _gone(kids), timeout=60)
    finally:
        stop_processes(sup)


def test_a_child_that_cannot_start_stops_the_supervisor(db_url, tmp_path):
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "outboxq.cli", "worker", "--handlers", "tests.no_such_module",
                           "--processes", "2"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "at start: stopping the others" in done.stderr


def test_processes_must_be_a_positive_number_or_auto(db_url):
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "outboxq.cli", "worker", "--handlers", "tests.handlers_basic",
                           "--processes", "0"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--processes must be a positive number or 'auto'" in done.stderr


def test_by_default_a_worker_runs_one_process_per_core_up_to_four(db_url, tmp_path, monkeypatch):
    from outboxq.workers.processes import MAX_AUTO_PROCESSES, default_count

    monkeypatch.delenv("OUTBOXQ_WORKER_PROCESSES", raising=False)
    expected = min(len(os.sched_getaffinity(0)), MAX_AUTO_PROCESSES)
    assert default_count() == expected
    sup = _supervisor(db_url, tmp_path / "w.log")
    try:
        if expected == 1:  # one core: no supervisor, the worker runs in this process
            time.sleep(3)
            assert sup.poll() is None and not psutil.Process(sup.pid).children()
        else:
            assert len(_children(sup, expected)) == expected
    finally:
        stop_processes(sup)


def test_outboxq_worker_processes_sets_the_default(db_url, tmp_path, monkeypatch):
    monkeypatch.setenv("OUTBOXQ_WORKER_PROCESSES", "3")
    sup = _supervisor(db_url, tmp_path / "w.log")
    try:
        assert len(_children(sup, 3)) == 3
    finally:
        stop_processes(sup)

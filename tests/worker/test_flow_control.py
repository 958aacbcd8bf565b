"""Flow control (issue 14) on a real PostgreSQL with worker processes: global and per-key concurrency limits,
rate limits, fairness between keys, dead workers' slots, limits changed at run time.

Each handler records its start and end in test_flow_runs (tests/handlers_flow.py); the assertions read those
rows: how many ran at once, how many started within any window of the rate limit's period.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

import tests.handlers_flow  # noqa: F401 - registers the consumers: enqueue computes their limit keys
from outboxq import cli, enqueue, enqueue_many
from outboxq.errors import InvalidLimit
from outboxq.queue import limits
from outboxq.queue.sql import limits as limits_sql
from outboxq.workers.claim_cursor import FROM_THE_FRONT
from outboxq.workers.keyless import ADOPT_WINDOW
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.handlers_flow import RUNS_DDL
from tests.support import claim_running, explain_prepared, plan_nodes, stop_processes, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _start_worker(db_url, log_path, queues, *extra):
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT), "OUTBOXQ_BACKOFF_JITTER": "0"}
    log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(
        [sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "worker", "--processes", "1",
         "--handlers", "tests.handlers_flow", "--queues", queues, "--poll-interval", "0.2", *extra],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )


_stop = stop_processes


def _fill(db_url, queue, payloads, **options):
    with psycopg.connect(db_url) as conn:
        conn.execute(RUNS_DDL)
        jobs = enqueue_many(conn, queue, payloads, **options)
        conn.commit()
    return jobs


def _count(db_url, statement, *params):
    with psycopg.connect(db_url) as c:
        return c.execute(statement, params).fetchone()[0]


def _runs(db_url, where="true"):
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        return c.execute(f"SELECT * FROM test_flow_runs WHERE {where} ORDER BY started_at").fetchall()


def _max_at_once(runs, until=None):
    """The most runs overlapping at any instant (a run with no end lasts until `until`, or forever)."""
    events = []
    for r in runs:
        events.append((r["started_at"], 1))
        end = r["finished_at"] or until
        if end is not None:
            events.append((end, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # an end at the same instant as a start frees its slot first
    at_once = best = 0
    for _, delta in events:
        at_once += delta
        best = max(best, at_once)
    return best


def _all_done(db_url, queue, n):
    return _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE queue = %s AND status = 'done'", queue) == n


def _run_until_done(worker, db_url, queue, n):
    """Run the (in-process) worker until the queue's n jobs are done, then stop it."""
    worker.start()
    try:
        wait_for(lambda: _all_done(db_url, queue, n))
    finally:
        worker.stop(timeout=5)


def test_global_concurrency_holds_across_worker_processes_and_is_reached(db_url, tmp_path):
    # Two handlers each: together they could run 4, so the limit of 3 binds across the processes, and both
    # take part (a worker whose own slot frees claims again at once, so one worker with 4 could take them all).
    workers = [_start_worker(db_url, tmp_path / f"w{i}.log", "flow_global", "--concurrency", "2")
               for i in range(2)]
    try:
        # The jobs come once both workers have announced themselves: on a loaded machine one process started
        # seconds after the other, and the first had run the jobs two at a time by then.
        wait_for(lambda: _count(db_url, "SELECT count(*) FROM outboxq_workers") == 2, timeout=60)
        _fill(db_url, "flow_global", [{"sleep": 0.15} for _ in range(30)])
        wait_for(lambda: _all_done(db_url, "flow_global", 30), timeout=60)
    finally:
        _stop(*workers)
    runs = _runs(db_url)
    assert len(runs) == 30
    assert _max_at_once(runs) == 3
    assert len({r["pid"] for r in runs}) == 2  # both processes took part


def test_per_key_concurrency_holds_per_key_while_keys_overlap(db_url, tmp_path):
    _fill(db_url, "flow_per_key", [{"tenant": t, "sleep": 0.15} for t in ("a", "b", "c") for _ in range(8)])
    with psycopg.connect(db_url) as c:  # the key came from limit_by at enqueue
        keys = c.execute("SELECT DISTINCT limit_key FROM outboxq_jobs ORDER BY 1").fetchall()
    assert keys == [("a",), ("b",), ("c",)]
    workers = [_start_worker(db_url, tmp_path / f"w{i}.log", "flow_per_key", "--concurrency", "8")
               for i in range(2)]
    try:
        wait_for(lambda: _all_done(db_url, "flow_per_key", 24), timeout=60)
    finally:
        _stop(*workers)
    runs = _runs(db_url)
    for tenant in ("a", "b", "c"):
        assert _max_at_once([r for r in runs if r["limit_key"] == tenant]) == 2
    assert _max_at_once(runs) > 2  # different keys ran at the same time


def test_rate_limit_starts_in_any_window_never_exceed_the_limit_and_use_no_attempt(db_url, tmp_path):
    _fill(db_url, "flow_rate", [{} for _ in range(35)])
    workers = [_start_worker(db_url, tmp_path / f"w{i}.log", "flow_rate", "--concurrency", "8")
               for i in range(2)]
    try:
        wait_for(lambda: _all_done(db_url, "flow_rate", 35), timeout=60)
    finally:
        _stop(*workers)
    assert len(_runs(db_url)) == 35
    # The limit counts starts as the claims that begin attempts (attempt_started_at, the database's clock): a
    # handler thread of a loaded machine may begin a claimed job a moment later, so handlers' own clocks could
    # see the starts of two windows bunch into one.
    with psycopg.connect(db_url) as c:
        starts = [row[0] for row in c.execute(
            "SELECT attempt_started_at FROM outboxq_jobs WHERE queue = 'flow_rate' ORDER BY 1").fetchall()]
    period = timedelta(seconds=1)
    in_window = [sum(1 for t in starts if s <= t < s + period) for s in starts]
    assert max(in_window) <= 10
    assert max(in_window) >= 9  # the limit is used, not just respected
    assert _count(db_url, "SELECT max(attempts) FROM outboxq_jobs WHERE queue = 'flow_rate'") == 1


def test_late_single_job_of_a_second_key_starts_while_the_first_keys_backlog_is_large(db_url, tmp_path):
    _fill(db_url, "flow_fair", [{"tenant": "bulk", "sleep": 0.01} for _ in range(3000)])
    worker = _start_worker(db_url, tmp_path / "w.log", "flow_fair", "--concurrency", "4")
    try:
        wait_for(lambda: _count(db_url, "SELECT count(*) FROM test_flow_runs") >= 20)
        with psycopg.connect(db_url) as conn:
            late = enqueue(conn, "flow_fair", {"tenant": "late"})
            conn.commit()
        wait_for(lambda: _count(db_url, "SELECT count(*) FROM test_flow_runs WHERE job_id = %s", late.id))
        bulk_left = _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE limit_key = 'bulk' "
                                   "AND status = 'queued'")
    finally:
        _stop(worker)
    assert bulk_left > 2000


def test_sigkilled_workers_slots_come_back_once_its_leases_expire(db_url, tmp_path):
    _fill(db_url, "flow_kill", [{"hang_first": True}, {"hang_first": True}, *({"sleep": 0.05} for _ in range(6))])
    victim = _start_worker(db_url, tmp_path / "victim.log", "flow_kill", "--concurrency", "4")
    survivor = None
    try:
        # Both slots are taken by the hanging jobs: nothing else starts.
        wait_for(lambda: _count(db_url, "SELECT count(*) FROM test_flow_runs") == 2)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        # Nothing renews the dead worker's leases now: they end when their rows say.
        lease_end = _count(db_url, "SELECT max(lease_expires_at) FROM outboxq_jobs WHERE status = 'running'")
        survivor = _start_worker(db_url, tmp_path / "survivor.log", "flow_kill", "--concurrency", "4")
        wait_for(lambda: _all_done(db_url, "flow_kill", 8), timeout=60)
    finally:
        _stop(victim, survivor)
    runs = _runs(db_url)
    killed = [r for r in runs if r["pid"] == victim.pid]
    assert len(killed) == 2 and all(r["finished_at"] is None for r in killed)
    # The killed runs held their slots until their leases expired; no more than 2 ran at once meanwhile.
    assert lease_end is not None and lease_end > max(r["started_at"] for r in killed)
    assert _max_at_once([r for r in runs if r["finished_at"] is not None or r in killed], until=lease_end) <= 2


def test_a_limit_changed_at_run_time_takes_effect(db_url, tmp_path, capsys):
    _fill(db_url, "flow_runtime", [{"sleep": 0.1} for _ in range(60)])
    worker = _start_worker(db_url, tmp_path / "w.log", "flow_runtime", "--concurrency", "4")
    try:
        wait_for(lambda: _count(db_url, "SELECT count(*) FROM test_flow_runs WHERE finished_at IS NOT NULL") >= 5)
        # Read before the change: read after it, a worker that took the new limit at once (it re-reads them every
        # few seconds) could start 3 jobs before the moment read, and they would count as started before it.
        with psycopg.connect(db_url) as c:
            changed_at = c.execute("SELECT clock_timestamp()").fetchone()[0]
        assert cli.main(["queues", "limit", "flow_runtime", "--global-concurrency", "3"]) == 0
        wait_for(lambda: _all_done(db_url, "flow_runtime", 60), timeout=60)
    finally:
        _stop(worker)
    runs = _runs(db_url)
    assert _max_at_once([r for r in runs if r["started_at"] < changed_at]) == 1
    assert _max_at_once(runs) == 3
    assert cli.main(["queues"]) == 0
    assert "flow_runtime" in capsys.readouterr().out


def test_queues_command_shows_limits_usage_and_busiest_keys(db_url, capsys):
    claim_running(db_url, "tenants", ["a", "a", "a", "b", "c"])
    assert cli.main(["queues", "limit", "tenants", "--rate-limit", "5/m"]) == 0
    assert "queue tenants: global concurrency 10, rate limit 5/m (per key)" in capsys.readouterr().out
    assert cli.main(["queues"]) == 0
    out = capsys.readouterr().out
    limits_table = out[out.index("limits ("):]
    row = next(line.split() for line in limits_table.splitlines() if line.startswith("tenants"))
    assert row == ["tenants", "10", "5/m", "True", "operator", "5", "0", "a:3,", "b:1,", "c:1"]
    assert cli.main(["queues", "--json"]) == 0
    usage = json.loads(capsys.readouterr().out)["limits"]
    assert usage[0]["busiest_keys"] == [{"key": "a", "running": 3}, {"key": "b", "running": 1},
                                        {"key": "c", "running": 1}]


def test_limit_key_given_to_enqueue_overrides_limit_by_and_bad_limits_are_refused(db_url):
    with psycopg.connect(db_url) as conn:
        job = enqueue(conn, "flow_per_key", {"tenant": "a"}, limit_key="vip")
        assert conn.execute("SELECT limit_key FROM outboxq_jobs WHERE id = %s", (job.id,)).fetchone() == ("vip",)
        # A queue without limit_by stores no key (and so costs the per-key index nothing).
        plain = enqueue(conn, "flow_global", {"tenant": "a"})
        assert conn.execute("SELECT limit_key FROM outboxq_jobs WHERE id = %s", (plain.id,)).fetchone() == (None,)
    assert limits.parse_rate_limit("200/s") == (200, 1.0)
    assert limits.parse_rate_limit("5/h") == (5, 3600.0)
    for bad in ("10", "10/d", "-1/s", "x/s"):
        with pytest.raises(InvalidLimit):
            limits.parse_rate_limit(bad)
    with pytest.raises(InvalidLimit):
        Consumer("q", lambda p: None, global_concurrency=-1).limits  # noqa: B018


def test_a_payload_that_limit_by_cannot_key_is_refused_with_a_message_and_writes_nothing(db_url):
    """A limit_by callable that fails on a payload (flow_fair's p["tenant"] on a payload without it), or a derived
    key longer than a limit key may be: the enqueue is refused with InvalidPayload saying what to fix, over HTTP a
    422, never a 500; nothing is written. The same payload with limit_key= given goes in."""
    from outboxq.errors import InvalidPayload
    from tests.api_support import api_client, job_count

    with psycopg.connect(db_url) as conn:
        with pytest.raises(InvalidPayload, match="limit_by could not give this payload a limit key.*KeyError"):
            enqueue(conn, "flow_fair", {"customer": "a"})
        with pytest.raises(InvalidPayload, match="at most 255 characters"):
            enqueue(conn, "flow_per_key", {"tenant": "x" * 256})
        with pytest.raises(InvalidPayload, match="limit_by could not give"):
            enqueue_many(conn, "flow_fair", [{"tenant": "a"}, {"customer": "b"}])
        conn.rollback()
    assert job_count(db_url) == 0
    with api_client(db_url, raise_server_exceptions=False) as api:
        response = api.post("/v1/queues/flow_fair/jobs", json={"payload": {"customer": "a"}})
        assert response.status_code == 422, response.text
        assert "limit_by could not give this payload a limit key" in response.text
        assert job_count(db_url) == 0
    with psycopg.connect(db_url) as conn:
        job = enqueue(conn, "flow_fair", {"customer": "a"}, limit_key="a")
        assert conn.execute("SELECT limit_key FROM outboxq_jobs WHERE id = %s", (job.id,)).fetchone() == ("a",)


def test_jobs_of_a_per_key_queue_enqueued_without_its_consumer_get_a_key_and_run(db_url):
    """A per-key claim reads only jobs with a limit key. Jobs enqueued where the consumer (its limit_by) is not
    known get none (here: a queue no consumer of this process is registered for, as over `outboxq serve` or from
    another service); the worker gives the keyless jobs at the front of the queue their key as enqueue would
    have, the shared empty key where the payload has none, and they run. Where the consumer is known, a payload
    without the field gets the shared empty key at enqueue."""
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "flow_adopt", [{"tenant": "a"}, {"tenant": "b"}, {"other": 1}])
        keyed_here = enqueue(conn, "flow_per_key", {"other": 1})
        conn.commit()
        keys = conn.execute("SELECT limit_key FROM outboxq_jobs WHERE queue = 'flow_adopt'").fetchall()
        assert keys == [(None,)] * 3
        assert conn.execute("SELECT limit_key FROM outboxq_jobs WHERE id = %s", (keyed_here.id,)).fetchone() == ("",)
    consumer = Consumer("flow_adopt", lambda payload: None, global_concurrency=5, limit_by="tenant")
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    with worker.state.connect_for_claims() as claims:
        worker.dispatcher.flow.read_limits(claims)
        queue_limits = worker.state.limits["flow_adopt"]
        assert worker.dispatcher.claim_limited(claims, consumer, queue_limits, 10) == []
        assert worker.dispatcher.flow.adopt_keyless(claims, consumer) == 3
        assert worker.dispatcher.flow.adopt_keyless(claims, consumer) == 0
        jobs = worker.dispatcher.claim_limited(claims, consumer, queue_limits, 10)
    assert sorted(j.payload.get("tenant", "") for j in jobs) == ["", "a", "b"]
    assert _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE queue = 'flow_adopt' AND status = 'running' "
                          "AND limit_key IS NOT NULL") == 3


def test_a_failed_look_for_keyless_jobs_strands_none_of_the_jobs_just_claimed(db_url, monkeypatch):
    """The look follows a short per-key claim: when it fails (the connection lost, say), the jobs that claim took
    have gone to the handlers already and run; the dispatcher reconnects and goes on."""
    from outboxq.workers.flow import FlowControl

    real_look, failed = FlowControl.adopt_keyless, []

    def look_failing_once_jobs_are_held(self, conn, consumer):
        if self.state.held() and not failed:
            failed.append(True)
            raise psycopg.OperationalError("the look failed")
        return real_look(self, conn, consumer)

    monkeypatch.setattr(FlowControl, "adopt_keyless", look_failing_once_jobs_are_held)
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "flow_adopt_fail", [{"t": "x"}, {"t": "y"}, {"t": "z"}], limit_keys=["x", "y", "z"])
        conn.commit()
    handled = []
    consumer = Consumer("flow_adopt_fail", handled.append, global_concurrency=100, limit_by="t")
    worker = Worker([consumer], url=db_url, run_maintenance=False, poll_interval=0.1).start()
    try:
        wait_for(lambda: len(handled) == 3, timeout=20)
    finally:
        worker.stop(timeout=5)
    assert failed


def test_a_keyless_job_enqueued_behind_a_long_keyed_backlog_gets_its_key_and_its_turn_at_once(db_url):
    """A job enqueued without its consumer (no key) behind more keyed jobs than the front window reads: the look
    at the newest jobs (those enqueued since the previous look's place, in commit order) gives it its key, and
    the next per-key claim takes it in its key's turn, while the backlog ahead of it still waits. A job whose
    transaction commits after more than a thousand later jobs did is keyed too, and so is a waiting one."""
    backlog = ADOPT_WINDOW + 500
    _fill(db_url, "flow_adopt_newest", [{"tenant": "big"}] * backlog, limit_keys=["big"] * backlog)
    consumer = Consumer("flow_adopt_newest", lambda payload: None, global_concurrency=5, limit_by="tenant")
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    dispatcher, flow = worker.dispatcher, worker.dispatcher.flow

    def look():
        flow.keyless._front_due.clear()
        flow.keyless._newest_due = 0.0
        return flow.adopt_keyless(claims, consumer)

    def looks(expected):  # (another writer of the cluster, autovacuum's ANALYZE say, can hold the look a moment)
        adopted = 0

        def enough():
            nonlocal adopted
            adopted += look()
            return adopted >= expected
        wait_for(enough, timeout=10)
        return adopted

    with worker.state.connect_for_claims() as claims:
        flow.read_limits(claims)
        assert flow.adopt_keyless(claims, consumer) == 0  # (the first look finds where the newest start)
        [newcomer] = _fill(db_url, "flow_adopt_newest", [{"tenant": "small"}])
        assert looks(1) == 1
        jobs = dispatcher.claim_limited(claims, consumer, worker.state.limits["flow_adopt_newest"], 5)
        # A job whose enqueue commits after 1,200 later jobs' did (a long transaction, a large batch): the look
        # does not pass a transaction still running.
        with psycopg.connect(db_url) as late, psycopg.connect(db_url) as conn:
            late_job = enqueue(late, "flow_adopt_newest", {"tenant": "late"})
            enqueue_many(conn, "flow_adopt_newest", [{"tenant": "big"}] * 1_200, limit_keys=["big"] * 1_200)
            blocker = enqueue(conn, "flow_adopt_newest", {"tenant": "big"}, key="blocker", limit_key="big")
            waiting = enqueue(conn, "flow_adopt_newest", {"tenant": "waiting"},
                              depends_on=[("flow_adopt_newest", "blocker")])
            conn.commit()
            assert look() == 0  # (nothing past a transaction still running: the later jobs wait for it)
            late.commit()
        assert looks(2) == 2  # the late one and the waiting one
        assert look() == 0 and flow.keyless._newest_after["flow_adopt_newest"][1] == waiting.id  # (the last committed)
        claims.autocommit = False
        plans = explain_prepared(claims, limits_sql.job_keyless_newest, {
            "queues": ["flow_adopt_newest"], "after_xids": [0], "after_ids": [newcomer.id], "window": 5_000})
        claims.rollback()
    assert newcomer.id in {j.id for j in jobs}
    assert blocker.status == "queued" and waiting.status == "waiting"
    for job, key in ((newcomer, "small"), (late_job, "late"), (waiting, "waiting")):
        assert _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE id = %s AND limit_key = %s", job.id, key) == 1
    assert _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE queue = 'flow_adopt_newest' "
                          "AND status = 'queued'") == backlog + 1 + 1 + 1_200 + 1 - len(jobs)
    nodes = [n for plan in plans for n in plan_nodes(plan)]  # the queue's new jobs through the feed index
    assert {n["Index Name"] for n in nodes if "Index Name" in n} == {"outboxq_jobs_feed_idx", "outboxq_jobs_pkey"}, plans
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), plans


def test_a_running_worker_runs_keyless_jobs_of_its_per_key_queue(db_url):
    """The same through a started worker: keyless jobs enqueued while it runs are given a key and handled."""
    handled = []
    consumer = Consumer("flow_adopt_live", handled.append, global_concurrency=2, limit_by=lambda p: p.get("t"))
    worker = Worker([consumer], url=db_url, run_maintenance=False, poll_interval=0.1).start()
    try:
        with psycopg.connect(db_url) as conn:
            enqueue_many(conn, "flow_adopt_live", [{"t": "x"}, {"t": "y"}, {}])
            conn.commit()
        wait_for(lambda: len(handled) == 3, timeout=20)
    finally:
        worker.stop(timeout=5)
    assert _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE queue = 'flow_adopt_live' AND status = 'done'") == 3


def test_a_queue_without_limits_claims_with_the_unlimited_statement(db_url):
    claimed_with = []

    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "plain", [{} for _ in range(5)])
        conn.commit()
    worker = Worker([Consumer("plain", lambda p: None)], url=db_url, poll_interval=0.05,
                    run_maintenance=False, listen=False)
    claim = worker.dispatcher.claim

    def recording(conn, consumer, limit, strategy=None, **kw):
        claimed_with.append(strategy)
        return claim(conn, consumer, limit, **({"strategy": strategy} if strategy else {}), **kw)

    worker.dispatcher.claim = recording
    _run_until_done(worker, db_url, "plain", 5)
    assert claimed_with and set(claimed_with) == {None}
    assert worker.state.limits == {}


def _flushed_past_the_commit_of(observer, before: str, flushed: str, xid: str) -> bool:
    """Whether the WAL was flushed to `flushed` past the commit record of transaction `xid` (written after
    `before`), read back with pg_walinspect once a synchronous commit has put the WAL so far on disk."""
    observer.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    observer.execute("SELECT pg_logical_emit_message(true, 'test', '')")  # a write that commits synchronously
    [(commit_end,)] = observer.execute("""
        SELECT end_lsn::text FROM pg_get_wal_records_info(%s, pg_current_wal_flush_lsn())
        WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT' AND xid = %s::xid""", (before, xid)).fetchall()
    return observer.execute("SELECT %s::pg_lsn >= %s::pg_lsn", (flushed, commit_end)).fetchone()[0]


@pytest.mark.parametrize("per_key", [False, True])
def test_the_dispatchers_limited_claims_and_declared_limits_are_on_disk_when_it_goes_on(db_url, per_key):
    """The dispatcher's connection commits without waiting for the disk (an unlimited claim may be lost in a
    crash: its jobs run again). A limited claim may not (its handlers would run beside the same jobs claimed
    again, over the limit), nor may the limits a consumer declares: both are flushed before the dispatcher goes
    on, and the connection is back to autocommit with asynchronous commits afterwards."""
    consumer = Consumer("flow_durable", lambda payload: None, global_concurrency=5,
                        **({"limit_by": "tenant"} if per_key else {}))
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "flow_durable", [{"tenant": "a"} for _ in range(3)],
                     **({"limit_keys": ["a"] * 3} if per_key else {}))
        conn.commit()
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    with worker.state.connect_for_claims() as conn, psycopg.connect(db_url, autocommit=True) as observer:
        before = observer.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
        worker.dispatcher.flow.read_limits(conn)
        flushed = observer.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
        [(declared_by,)] = observer.execute("SELECT xmin::text FROM outboxq_queue_limits").fetchall()
        assert _flushed_past_the_commit_of(observer, before, flushed, declared_by)

        before = observer.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
        jobs = worker.dispatcher.claim_limited(conn, consumer, worker.state.limits["flow_durable"], 3)
        flushed = observer.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
        claimed_by = observer.execute("SELECT DISTINCT xmin::text FROM outboxq_jobs WHERE id = ANY(%s)",
                                      ([j.id for j in jobs],)).fetchall()
        assert len(jobs) == 3 and len(claimed_by) == 1
        assert _flushed_past_the_commit_of(observer, before, flushed, claimed_by[0][0])
        assert conn.autocommit and conn.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"] == "off"


@pytest.mark.parametrize("change", ["lowered", "added"])
def test_unstarted_jobs_claimed_beyond_a_limit_set_since_go_back_to_the_queue(db_url, change):
    """A worker holds a buffer of claimed jobs that no handler started yet: of a queue whose limit could not bind
    (or that had none), as many as an unlimited queue's. When an operator lowers the limit so that it binds (or
    adds one), the worker's next reading of the limits hands those jobs back (queued again, their attempt
    undone) rather than start them beyond the new limit; another queue's buffered jobs stay. A limit lowered
    but still beyond what the worker holds leaves them."""
    queue = f"flow_buffer_{change}"
    consumer = Consumer(queue, lambda payload: None,
                        **({"global_concurrency": 10_000} if change == "lowered" else {}))
    other = Consumer("flow_buffer_other", lambda payload: None)
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, queue, [{} for _ in range(6)])
        enqueue_many(conn, "flow_buffer_other", [{} for _ in range(2)])
        conn.commit()
    worker = Worker([consumer, other], url=db_url, run_maintenance=False, listen=False)
    state = worker.state
    with state.connect_for_claims() as claims:
        worker.dispatcher.flow.read_limits(claims)
        if change == "lowered":
            held = worker.dispatcher.claim_limited(claims, consumer, state.limits[queue], 6)
            with psycopg.connect(db_url) as conn:
                limits.set_limits(conn, queue, global_concurrency=5_000, set_concurrency=True)
                conn.commit()
        else:
            held = worker.dispatcher.claim(claims, consumer, 6)
        held += worker.dispatcher.claim(claims, other, 2)
        for job in held:
            state.work.put(job)
        worker.dispatcher.flow.read_limits(claims)
        assert state.work.qsize() == 8 and state.buffered == 8  # 5,000 cannot bind what the worker holds
        with psycopg.connect(db_url) as conn:
            limits.set_limits(conn, queue, global_concurrency=2, set_concurrency=True)
            conn.commit()
        worker.dispatcher.flow.read_limits(claims)
    assert state.buffered == 2 and [job.queue for job in _handed_out(worker)] == ["flow_buffer_other"] * 2
    assert set(state.in_flight) == {j.id for j in held if j.queue == "flow_buffer_other"}
    assert _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE queue = %s AND status = 'queued' "
                          "AND attempts = 0 AND lease_token IS NULL", queue) == 6


def test_the_dispatchers_unlimited_claim_is_one_statement_that_leaves_no_transaction_open(db_url):
    consumer = Consumer("plain_one", lambda payload: None)
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "plain_one", [{} for _ in range(3)])
        conn.commit()
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    with worker.state.connect_for_claims() as conn:
        jobs = worker.dispatcher.claim(conn, consumer, 10)
        assert len(jobs) == 3 and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # Committed: another connection sees the jobs running under the claim's lease.
    assert _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE status = 'running' AND lease_token = %s",
                  jobs[0].lease_token) == 3


def test_a_per_key_claim_hands_out_jobs_round_robin_and_resumes_after_the_last_key_served(db_url):
    """Every key's first job, then every key's second job..., the keys in scan order (after the last key the
    previous claim served, wrapping around); the next claim resumes after the last key of this one."""
    consumer = Consumer("flow_rr", lambda payload: None, global_concurrency=10, limit_by="tenant")
    keys = ["a", "a", "a", "b", "c", "c", "d"]
    with psycopg.connect(db_url) as conn:
        jobs = enqueue_many(conn, "flow_rr", [{"n": i} for i in range(len(keys))], limit_keys=keys)
        limits.declare(conn, consumer.limits)
        conn.commit()
    key_of = {job.id: key for job, key in zip(jobs, keys, strict=True)}
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    queue_limits = limits.QueueLimits("flow_rr", global_concurrency=10, per_key=True)
    with worker.connect() as conn:
        worker.dispatcher.flow.turns._after_key["flow_rr"] = "b"  # as if the previous claim ended with key b
        first = worker.claim_limited(conn, consumer, queue_limits, 5)
        # Four keys share five jobs (at most two each): c, d, then a and b (wrapped around), then c again.
        assert [key_of[j.id] for j in first] == ["c", "d", "a", "b", "c"]
        assert [j.id for j in first if key_of[j.id] == "c"] == [jobs[4].id, jobs[5].id]  # a key's jobs in order
        assert worker.dispatcher.flow.turns._after_key["flow_rr"] == "b"
        second = worker.claim_limited(conn, consumer, queue_limits, 5)
        assert [j.id for j in second] == [jobs[1].id, jobs[2].id]
        assert worker.dispatcher.flow.turns._after_key["flow_rr"] == "a"


def _limited_queue(db_url, queue, limit, jobs, per_key):
    """A queue limited to `limit` running (per key: one key, "a"), `jobs` queued; its consumer, a worker (not
    started) and the limits."""
    consumer = Consumer(queue, lambda payload: None, global_concurrency=limit,
                        **({"limit_by": "tenant"} if per_key else {}))
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, queue, [{"tenant": "a"} for _ in range(jobs)],
                     **({"limit_keys": ["a"] * jobs} if per_key else {}))
        limits.declare(conn, consumer.limits)
        conn.commit()
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    return consumer, worker, limits.QueueLimits(queue, global_concurrency=limit, per_key=per_key)


@pytest.mark.parametrize("per_key", [False, True])
def test_a_claim_far_from_its_limit_runs_beside_one_in_flight_and_one_near_it_waits_for_it(db_url, per_key):
    """Claims of a limited queue take a shared slot while the limit leaves room for every claim that may be in
    flight beside them (limits_sql.SHARED_RESERVE): they neither wait for each other nor count on jobs they
    cannot see. A claim that the reserve holds back is made again holding every slot, after the claims in flight
    have committed, and then gets all that the limit allows; should that fail, what the shared claim took is
    handed out all the same."""
    consumer, worker, queue_limits = _limited_queue(db_url, "flow_slots", limits_sql.SHARED_RESERVE + 5, 12,
                                                    per_key)
    with psycopg.connect(db_url) as in_flight, worker.state.connect_for_claims() as conn:
        conn.execute("SET lock_timeout = '1s'")  # a claim that waits for the slot held below fails

        def reconnected() -> None:  # what the dispatcher does after an error: a fresh transaction, autocommit
            conn.rollback()
            conn.autocommit = True

        in_flight.execute(limits_sql.queue_limit_claim_shared, {"queue": "flow_slots", "first_slot": 0})
        # Beside the claim in flight, a shared slot: 5 jobs leave the reserve free. The rest of the 10 asked for
        # needs every slot: that claim waits for the one held, and fails; the 5 jobs are handed out all the same.
        assert len(worker.claim_limited(conn, consumer, queue_limits, 10)) == 5
        reconnected()
        # Now the reserve holds back every job: the claim goes exclusive at once and waits for the claim in flight.
        with pytest.raises(psycopg.errors.LockNotAvailable):
            worker.claim_limited(conn, consumer, queue_limits, 5)
        reconnected()
        in_flight.rollback()  # the claim in flight ends: the exclusive claim counts 5 running, and takes 5 more
        assert len(worker.claim_limited(conn, consumer, queue_limits, 5)) == 5
    assert _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE queue = 'flow_slots' AND status = 'running'") == 10


@pytest.mark.parametrize("per_key", [False, True])
def test_a_shared_claim_short_of_jobs_not_of_room_returns_them_without_an_exclusive_claim(db_url, per_key):
    """A shared claim that the backlog cut short (3 jobs for 10 asked, far from the limit) hands them out at
    once: an exclusive claim would wait for the claims in flight and find nothing more."""
    consumer, worker, queue_limits = _limited_queue(db_url, "flow_short", limits_sql.SHARED_RESERVE + 1000, 3,
                                                    per_key)
    with psycopg.connect(db_url) as in_flight, worker.state.connect_for_claims() as conn:
        conn.execute("SET lock_timeout = '1s'")
        in_flight.execute(limits_sql.queue_limit_claim_shared, {"queue": "flow_short", "first_slot": 0})
        assert len(worker.claim_limited(conn, consumer, queue_limits, 10)) == 3
        # No exclusive claim waited for the slot held and failed: the connection is as a claim leaves it.
        assert conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.parametrize("batch_size, max_in_flight, expected", [
    (500, 1_000, 1_000),  # the defaults: what the worker may hold
    (1_000, 2_000, limits_sql.SHARED_CLAIM_MAX),  # no larger than a claim that still shares the slots
    (100, 200, 200),
    (2_000, 4_000, 2_000),  # never less than the batch the user chose
])
def test_a_limited_claim_takes_what_the_worker_may_hold_up_to_a_shared_claim_and_at_least_a_batch(
        batch_size, max_in_flight, expected):
    assert limits.claim_size(batch_size, max_in_flight) == expected


def test_the_dispatcher_claims_a_limit_that_cannot_bind_in_claims_larger_than_a_batch(db_url):
    """A limited claim's fixed cost (claim slot, running count, synchronous commit) is paid per claim: where the
    limit cannot bind in this worker, the dispatcher claims what the worker may hold (limits.claim_size), not one
    batch."""
    asked = []
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "flow_big_claims", [{} for _ in range(600)])
        conn.commit()
    worker = Worker([Consumer("flow_big_claims", lambda p: None, global_concurrency=10_000)], url=db_url,
                    batch_size=100, concurrency=4, poll_interval=0.05, run_maintenance=False, listen=False)
    claim_limited = worker.dispatcher.claim_limited

    def recording(conn, consumer, limits_, limit):
        asked.append(limit)
        return claim_limited(conn, consumer, limits_, limit)

    worker.dispatcher.claim_limited = recording
    _run_until_done(worker, db_url, "flow_big_claims", 600)
    assert worker.state.max_in_flight == 200
    assert asked[0] == limits.claim_size(100, 200) == 200  # not the batch of 100


@pytest.mark.parametrize("limit, depth, typical_job_s, expected", [
    (500, None, 0.0001, limits.key_budget(500)),  # no full claim yet: every key it may need
    (500, 5.0, None, limits.key_budget(500)),  # no handler time measured yet
    (500, 1.0, 0.0001, limits.key_budget(500)),  # one job per key (more keys than jobs): they may hold no more
    (500, 5.0, 0.0001, 50),  # keys that gave 5 each: turns of 10
    (500, 100.0, 0.0001, math.ceil(500 / limits.KEY_TURN_MAX)),  # deep keys: turns of KEY_TURN_MAX
    (500, 100.0, limits.KEY_TURN_S / 5, 100),  # slower jobs: turns of KEY_TURN_S of handler time (5 jobs)
    (500, 100.0, limits.KEY_TURN_S / 1.5, limits.key_budget(500)),  # under two jobs a turn: every key
    (3, 100.0, 0.0001, 1),
])
def test_a_per_key_claim_scans_enough_keys_for_its_jobs_in_turns_twice_as_deep_as_the_keys_have_shown(
        limit, depth, typical_job_s, expected):
    assert limits.keys_to_scan(limit, depth, typical_job_s) == expected


def test_the_typical_handler_time_follows_each_writes_median_so_a_few_stalled_handlers_do_not_move_it():
    """What the per-key turns and the fair hold are computed from: a write of 300 no-op jobs in which 10 waited
    50 ms (for the GIL, say) leaves the typical time near the others' 20 us, where their mean (1.7 ms) would have
    cut the turns to a few jobs; jobs that really take longer move it within a few writes."""
    fast = [0.00002] * 290 + [0.05] * 10
    assert limits.typical_job_seconds(None, [0.00002] * 300) == pytest.approx(0.00002)
    assert limits.typical_job_seconds(0.00002, fast) == pytest.approx(0.00002)
    typical = 0.00002
    for _ in range(10):
        typical = limits.typical_job_seconds(typical, [0.002] * 300)
    assert typical == pytest.approx(0.002, rel=0.05)


def test_the_depth_a_per_key_claim_shows_is_its_jobs_per_key_when_full_else_none():
    rows = [{"limit_key": k} for k in "aabbcc"]
    assert limits.key_depth_shown(rows, 6) == 2.0
    assert limits.key_depth_shown(rows, 7) is None  # short: the keys may hold no more
    assert limits.key_depth_shown([], 6) is None


def test_per_key_claims_over_deep_keys_take_them_in_longer_turns_and_a_short_one_is_claimed_again_at_once(
        db_url, monkeypatch):
    """Each key scanned costs a probe and a pick: once a full claim has shown that its keys hold their shares,
    the next claims scan fewer keys and take more of each (turns twice as deep, up to KEY_TURN_MAX), still round
    robin. A claim that finds its fewer keys shallower comes back short, and the dispatcher claims again at once,
    scanning every key (the queue is not idle)."""
    monkeypatch.setattr(limits, "KEY_TURN_MAX", 20)  # (the cap this walk through 8 keys of 30 jobs is laid out for)
    consumer = Consumer("flow_turns", lambda payload: None, global_concurrency=10_000, limit_by="tenant")
    keys = [k for k in "abcdefgh" for _ in range(30)]
    with psycopg.connect(db_url) as conn:
        jobs = enqueue_many(conn, "flow_turns", [{} for _ in keys], limit_keys=keys)
        limits.declare(conn, consumer.limits)
        conn.commit()
    key_of = {job.id: key for job, key in zip(jobs, keys, strict=True)}
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    worker.state.job_seconds["flow_turns"] = 0.0001  # as measured for no-op handlers
    queue_limits = limits.QueueLimits("flow_turns", global_concurrency=10_000, per_key=True)

    def turns(claimed):
        return {key: [key_of[j.id] for j in claimed].count(key) for key in dict.fromkeys(key_of[j.id] for j in claimed)}

    with worker.state.connect_for_claims() as conn:
        assert turns(worker.claim_limited(conn, consumer, queue_limits, 40)) == dict.fromkeys("abcdefgh", 5)
        assert turns(worker.claim_limited(conn, consumer, queue_limits, 40)) == dict.fromkeys("abcd", 10)
        assert turns(worker.claim_limited(conn, consumer, queue_limits, 40)) == dict.fromkeys("ef", 20)
        assert turns(worker.claim_limited(conn, consumer, queue_limits, 40)) == dict.fromkeys("gh", 20)
        assert "flow_turns" not in worker.dispatcher.flow._claim_again
        # a..d hold 15 jobs each now, e..h 5: turns of 20 over 2 keys find 30 of 40, and the queue is to be
        # claimed again at once, over every key (40 shared out over c..h, then wrapped round to the empty a, b).
        assert turns(worker.claim_limited(conn, consumer, queue_limits, 40)) == dict.fromkeys("ab", 15)
        assert "flow_turns" in worker.dispatcher.flow._claim_again
        assert turns(worker.claim_limited(conn, consumer, queue_limits, 40)) == {
            "c": 7, "d": 7, "e": 5, "f": 5, "g": 5, "h": 5}
        assert "flow_turns" not in worker.dispatcher.flow._claim_again


@pytest.mark.parametrize("per_key", [False, True])
def test_a_limited_claim_planned_while_the_queue_was_empty_reads_the_indexes_once_it_fills(db_url, per_key):
    """A limited claim runs with the generic plan PostgreSQL made when psycopg prepared it, and keeps it until the
    jobs table's statistics change (autovacuum). Made while the table was empty, that plan must still read the
    indexes when the jobs pour in: a sequential scan of the jobs table (and of its history) would be fast on the
    empty table and stay in the plan of every claim that follows. On a connection of the caller's (the worker's
    own connections price sequential scans out for the whole session): the claim's own settings do it."""
    consumer = Consumer("flow_empty", lambda payload: None, global_concurrency=10_000,
                        **({"limit_by": "tenant"} if per_key else {}))
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    with worker.state.connect(autocommit=True) as conn:
        worker.dispatcher.flow.read_limits(conn)
        queue_limits = worker.state.limits["flow_empty"]
        for _ in range(8):  # prepared within these claims (a shared claim and an exclusive one each), queue empty
            assert worker.dispatcher.claim_limited(conn, consumer, queue_limits, 100) == []
        statement = limits_sql.job_claim_limited_per_key if per_key else limits_sql.job_claim_limited
        _fill(db_url, "flow_empty", [{"tenant": f"t{i % 50}"} for i in range(20_000)],
              **({"limit_keys": [f"t{i % 50}" for i in range(20_000)]} if per_key else {}))
        # The plan the next claim runs: EXPLAIN EXECUTE takes it from the same plan cache (under the claim's
        # plan_cache_mode, else it could plan anew for the EXPLAIN).
        conn.autocommit = False
        conn.execute(limits_sql.claim_generic_plan)
        [plan] = explain_prepared(conn, statement, {
            "queue": "flow_empty", "limit": 100, "lease_token": uuid.uuid4(), "lease_s": 60.0, "worker_id": "w",
            "default_max_attempts": 25, **FROM_THE_FRONT, "reserve": 0, "after_key": "",
            "max_keys": limits.key_budget(100)})
        conn.rollback()
    scans = [(n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan)
             if n.get("Relation Name") == "outboxq_jobs"]
    assert scans and all(kind != "Seq Scan" for kind, _ in scans), scans
    # Only the indexes meant for them (none that grows with the history, as the feed index would).
    used = {n["Index Name"] for n in plan_nodes(plan) if n.get("Index Name", "").startswith("outboxq_jobs_")}
    assert used <= {"outboxq_jobs_claim_idx", "outboxq_jobs_retry_idx", "outboxq_jobs_lease_idx",
                    "outboxq_jobs_limit_key_idx", "outboxq_jobs_pkey"}, used


def _status(db_url, job_id):
    return _count(db_url, "SELECT status FROM outboxq_jobs WHERE id = %s", job_id)


def _running(db_url, queue):
    return _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE queue = %s AND status = 'running'", queue)


def _handover_queue(db_url, queue, limit, jobs):
    """A queue limited to `limit` running, `jobs` queued, its worker (not started, its limits read), and `limit` of
    its jobs claimed by that worker (held, not yet given to a handler)."""
    consumer, worker, queue_limits = _limited_queue(db_url, queue, limit, jobs, per_key=False)
    with worker.state.connect_for_claims() as claims:
        worker.dispatcher.flow.read_limits(claims)
        running = worker.claim_limited(claims, consumer, queue_limits, limit)
    assert len(running) == limit and worker.dispatcher.flow.hands_over(worker.state.limits[queue])
    return worker, running


def _handed_out(worker):
    """The jobs given to the handlers since the last call."""
    jobs = []
    while not worker.state.work.empty():
        jobs.append(worker.state.work.get_nowait())
    return jobs


def test_a_completion_hands_its_slot_to_the_queues_next_job_in_one_statement_without_a_claim_slot(db_url):
    """A queue whose only limit is a global concurrency that binds within the worker: the completer's write
    completes the job and claims the queue's next one into the slot it frees, in one statement (on the completer's
    autocommit connection: no transaction left open), without the claim slots that the dispatcher's claims wait
    for (held here by another session): the count of running jobs does not change, so it needs none. The job
    claimed goes to the handlers, held by the worker."""
    from outboxq.workers.executor import Outcome

    worker, running = _handover_queue(db_url, "flow_handover", 2, 5)
    worker.state.idle_until["flow_handover"] = 1e12
    with psycopg.connect(db_url) as slots, worker.state.connect_for_completions() as writes:
        writes.execute("SET lock_timeout = '2s'")  # (waiting for the claim slots would fail the write)
        slots.execute(limits_sql.queue_limit_claim_exclusive, {"queue": "flow_handover"})
        worker.write_outcomes(writes, [Outcome(job=running[0], succeeded=True)])
        assert writes.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    [handed] = _handed_out(worker)
    assert handed.id not in {j.id for j in running} and handed.id in worker.state.in_flight
    assert _status(db_url, running[0].id) == "done" and _status(db_url, handed.id) == "running"
    assert _running(db_url, "flow_handover") == 2
    # One transaction (one xmin) completed the job and claimed the next; the dispatcher is not asked to claim.
    assert _count(db_url, "SELECT count(DISTINCT xmin::text) FROM outboxq_jobs WHERE id = ANY(%s)",
                  [running[0].id, handed.id]) == 1
    assert worker.state.idle_until["flow_handover"] == 1e12


def test_a_handover_keeps_a_lowered_limit_and_leaves_slots_near_their_lease_end_to_the_counted_claim(db_url):
    """A slot is handed over only while the queue runs no more than its limit: after the limit is lowered from 3
    to 2, the first completion frees its slot for good and the next one hands its slot over. A job whose lease is
    nearly over (less than half left) does not hand its slot over: once expired it no longer counts as running,
    and another claim may have taken its slot already; the dispatcher is told to claim instead. A completion
    fenced out (its lease taken away) completes nothing and hands nothing over."""
    from dataclasses import replace

    from outboxq.workers.executor import Outcome

    worker, running = _handover_queue(db_url, "flow_handover_low", 3, 8)
    with psycopg.connect(db_url) as conn:
        limits.set_limits(conn, "flow_handover_low", global_concurrency=2, set_concurrency=True)
        conn.commit()
    with worker.state.connect_for_claims() as claims:
        worker.dispatcher.flow.read_limits(claims)
    with worker.state.connect_for_completions() as writes:
        worker.write_outcomes(writes, [Outcome(job=running[0], succeeded=True)])
        assert _handed_out(worker) == [] and _running(db_url, "flow_handover_low") == 2
        worker.write_outcomes(writes, [Outcome(job=running[1], succeeded=True)])
        [handed] = _handed_out(worker)
        assert _running(db_url, "flow_handover_low") == 2

        fenced = replace(handed, lease_token=uuid.uuid4())
        worker.write_outcomes(writes, [Outcome(job=fenced, succeeded=True)])
        assert _handed_out(worker) == [] and _status(db_url, handed.id) == "running"
        assert worker.state.stats["fenced"] == 1

        with psycopg.connect(db_url) as conn:
            conn.execute("UPDATE outboxq_jobs SET lease_expires_at = now() + interval '5 seconds' WHERE id = %s",
                         (running[2].id,))
        worker.state.idle_until["flow_handover_low"] = 1e12
        worker.write_outcomes(writes, [Outcome(job=running[2], succeeded=True)])
        assert _status(db_url, running[2].id) == "done"
        assert _handed_out(worker) == [] and _running(db_url, "flow_handover_low") == 1
        assert worker.state.idle_until["flow_handover_low"] == 0.0  # the dispatcher claims the free slot


def test_a_write_with_a_failure_hands_over_only_the_completed_jobs_slot_in_one_transaction(db_url):
    """A write that fails one job and completes another is one transaction (on the completer's autocommit
    connection too): the completed job's slot goes to the queue's next job in it, the failed job's (now retrying)
    to the dispatcher's counted claim."""
    from outboxq.workers.executor import Outcome

    worker, running = _handover_queue(db_url, "flow_handover_mixed", 2, 5)
    with worker.state.connect_for_completions() as writes:
        worker.state.idle_until["flow_handover_mixed"] = 1e12
        worker.write_outcomes(writes, [Outcome(job=running[0], succeeded=True),
                                       Outcome(job=running[1], succeeded=False, error="boom")])
        assert writes.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    [handed] = _handed_out(worker)
    assert _status(db_url, running[0].id) == "done" and _status(db_url, running[1].id) == "retrying"
    assert _running(db_url, "flow_handover_mixed") == 1 and _status(db_url, handed.id) == "running"
    assert worker.state.idle_until["flow_handover_mixed"] == 0.0  # the dispatcher claims the failed job's slot
    assert worker.state.stats["completed"] == 1 and worker.state.stats["failed"] == 1
    # One transaction wrote the three rows.
    assert _count(db_url, "SELECT count(DISTINCT xmin::text) FROM outboxq_jobs WHERE id = ANY(%s)",
                  [running[0].id, running[1].id, handed.id]) == 1


def test_a_rate_limit_added_since_the_worker_read_the_limits_stops_the_handover(db_url):
    """The worker re-reads the limits every few seconds; meanwhile an operator may add a rate limit, whose starts
    must all be logged and counted: the handover reads the stored limits and claims nothing then (the slot goes
    to the dispatcher's counted claim)."""
    from outboxq.workers.executor import Outcome

    worker, running = _handover_queue(db_url, "flow_handover_rate", 2, 5)
    with psycopg.connect(db_url) as conn:
        limits.set_limits(conn, "flow_handover_rate", rate_limit="1/h", set_rate=True)
        conn.commit()
    assert worker.dispatcher.flow.hands_over(worker.state.limits["flow_handover_rate"])  # (not read again yet)
    worker.state.idle_until["flow_handover_rate"] = 1e12
    with worker.state.connect_for_completions() as writes:
        worker.write_outcomes(writes, [Outcome(job=running[0], succeeded=True)])
    assert _status(db_url, running[0].id) == "done"
    assert _handed_out(worker) == [] and _running(db_url, "flow_handover_rate") == 1
    assert _count(db_url, "SELECT count(*) FROM outboxq_limit_starts") == 0
    assert worker.state.idle_until["flow_handover_rate"] == 0.0


def test_a_limit_raised_to_the_largest_integer_since_the_worker_read_the_limits_still_hands_over(db_url):
    """An operator may raise a binding limit to the largest one stored (limits.MAX_LIMIT) while the worker still
    hands its slots over: the handover's arithmetic does not overflow (the completion would fail with "integer out
    of range" until the worker read the limits again); the slot goes to the next job."""
    from outboxq.workers.executor import Outcome

    worker, running = _handover_queue(db_url, "flow_handover_max", 2, 5)
    with psycopg.connect(db_url) as conn:
        limits.set_limits(conn, "flow_handover_max", global_concurrency=limits.MAX_LIMIT, set_concurrency=True)
        conn.commit()
    with worker.state.connect_for_completions() as writes:
        worker.write_outcomes(writes, [Outcome(job=running[0], succeeded=True)])
    assert _status(db_url, running[0].id) == "done" and worker.state.stats["completed"] == 1
    [handed] = _handed_out(worker)
    assert _status(db_url, handed.id) == "running" and _running(db_url, "flow_handover_max") == 2


def test_the_handover_prepared_while_the_queue_was_empty_reads_the_indexes_once_it_fills(db_url):
    """The completer prepares its handover statement when it connects (Dispatcher.prepare_handovers), often
    before any job exists; that generic plan is kept, and must still read the indexes once the jobs pour in."""
    consumer = Consumer("flow_handover_plan", lambda payload: None, global_concurrency=4)
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    with worker.state.connect_for_claims() as claims:
        worker.dispatcher.flow.read_limits(claims)  # (declares the limits)
    with worker.state.connect_for_completions() as writes:
        worker.dispatcher.prepare_handovers(writes)
        _fill(db_url, "flow_handover_plan", [{} for _ in range(20_000)])
        writes.autocommit = False
        plans = explain_prepared(writes, limits_sql.job_complete_handing_over, {
            "ids": "{1,2}", "lease_tokens": "{}", "handed_ids": "{1}", "queue": "flow_handover_plan",
            "lease_margin_s": 30.0, "limit": 1, "lease_token": uuid.uuid4(), "lease_s": 60.0, "worker_id": "w",
            "default_max_attempts": 25, **FROM_THE_FRONT})
        writes.rollback()
    for plan in plans:
        scans = [(n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan)
                 if n.get("Relation Name") == "outboxq_jobs"]
        assert scans and all(kind != "Seq Scan" for kind, _ in scans), scans
        used = {n["Index Name"] for n in plan_nodes(plan) if n.get("Index Name", "").startswith("outboxq_jobs")}
        assert {"outboxq_jobs_claim_idx", "outboxq_jobs_pkey"} <= used <= {
            "outboxq_jobs_claim_idx", "outboxq_jobs_retry_idx", "outboxq_jobs_lease_idx", "outboxq_jobs_pkey",
            "outboxq_jobs_waiting_idx"}, used


def test_the_handover_statement_is_short_enough_for_psycopg_to_keep_its_conversion():
    """The handover runs at every write of a queue that hands its slots over: psycopg converts a statement's
    placeholders once and keeps the result only for texts of up to MAX_CACHED_STATEMENT_LENGTH bytes."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    assert len(limits_sql.job_complete_handing_over.encode()) <= MAX_CACHED_STATEMENT_LENGTH

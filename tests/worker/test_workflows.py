"""Workflows (outboxq.Workflow) and sequences on a real PostgreSQL, with real workers: steps run once each in
DAG order, results flow to the next step, failure cancels what comes after, operators cancel and retry, a
SIGKILLed worker costs nothing; sequences run one job at a time, in enqueue order."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from outboxq import (
    InvalidInput,
    InvalidTransition,
    Workflow,
    WorkflowNotFound,
    cancel_workflow,
    enqueue,
    get_job,
    get_workflow,
    list_workflows,
    retry_workflow,
)
from outboxq.queue import admin
from outboxq.workers.maintenance import promote
from tests.handlers_runtime import isolated_registry  # noqa: F401
from tests.handlers_workflow import EFFECTS_DDL, SEQUENCE_DDL
from tests.support import sequence_held_by_a_dead_job, stop_processes, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _workers(db_url: str, log: Path, count: int = 2) -> list[subprocess.Popen]:
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT), "OUTBOXQ_LEASE_S": "3"}
    out = open(log, "ab")  # noqa: SIM115 - lives as long as the processes
    return [subprocess.Popen([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "worker",
                              "--processes", "1", "--handlers", "tests.handlers_workflow", "--poll-interval", "0.1"],
                             env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT) for _ in range(count)]


@pytest.fixture
def tables(db_url):
    with psycopg.connect(db_url) as c:
        c.execute(EFFECTS_DDL)
        c.execute(SEQUENCE_DDL)
    return db_url


def _diamond(name: str, value: int = 1, fail_left: bool = False) -> Workflow:
    wf = Workflow(name)
    fetch = wf.step("fetch", queue="wf-fetch", payload={"value": value})
    left = wf.step("left", queue="wf-left", payload={"value": value * 10, "fail": fail_left}, after=[fetch])
    # (right hands its result on by returning it, after its transaction: the path where the worker stores it)
    right = wf.step("right", queue="wf-right", payload={"value": value * 100, "return_only": True}, after=[fetch])
    wf.step("join", queue="wf-join", payload={"value": 0}, after=[left, right])
    return wf


def _statuses(db_url: str, workflow_id: int) -> dict[str, str]:
    with psycopg.connect(db_url) as c:
        info = get_workflow(c, workflow_id)
    assert info is not None
    return {s.name: s.status for s in info.steps}


def _effects(db_url: str) -> list[dict]:
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        return c.execute("SELECT * FROM test_wf_effects ORDER BY at").fetchall()


def test_ten_diamonds_under_two_workers_run_each_step_once_and_each_join_sees_both_results(tables, tmp_path):
    db_url = tables
    with psycopg.connect(db_url) as conn:
        ids = [_diamond(f"order-{i}", value=i + 1).enqueue(conn) for i in range(10)]
        conn.commit()
    workers = _workers(db_url, tmp_path / "w.log")
    try:
        wait_for(lambda: all(set(_statuses(db_url, i).values()) == {"done"} for i in ids), timeout=60)
    finally:
        stop_processes(*workers)
    effects = _effects(db_url)
    assert len(effects) == 40 and len({e["job_id"] for e in effects}) == 40
    for n, workflow_id in enumerate(ids, start=1):
        mine = {e["step"]: e for e in effects if e["workflow_id"] == workflow_id}
        assert set(mine) == {"fetch", "left", "right", "join"}
        assert mine["join"]["parents"] == {"left": {"step": "left", "value": n * 10},
                                           "right": {"step": "right", "value": n * 100}}
        assert mine["left"]["parents"] == {"fetch": {"step": "fetch", "value": n}}
        assert mine["fetch"]["parents"] == {}
        # each step after the ones it waits for
        assert mine["fetch"]["at"] < mine["left"]["at"] < mine["join"]["at"]
        assert mine["right"]["at"] < mine["join"]["at"]
        with psycopg.connect(db_url) as c:
            info = get_workflow(c, workflow_id)
        assert info.status == "done" and info.name == f"order-{n - 1}"
        assert {s.name: s.result for s in info.steps}["join"] == {"step": "join", "value": 0}
    with psycopg.connect(db_url) as c:
        listed = list_workflows(c, limit=5)
    assert [w["id"] for w in listed] == sorted(ids, reverse=True)[:5]
    assert all(w["status"] == "done" and w["done"] == 4 and w["steps"] == 4 for w in listed)


def test_a_workflow_in_a_rolled_back_transaction_never_exists_nor_runs(tables, tmp_path):
    db_url = tables
    with psycopg.connect(db_url) as conn:
        workflow_id = _diamond("rolled-back").enqueue(conn)
        conn.rollback()
        kept = _diamond("kept").enqueue(conn)
        conn.commit()
    workers = _workers(db_url, tmp_path / "w.log", count=1)
    try:
        wait_for(lambda: set(_statuses(db_url, kept).values()) == {"done"}, timeout=30)
    finally:
        stop_processes(*workers)
    with psycopg.connect(db_url) as c:
        assert get_workflow(c, workflow_id) is None
        assert c.execute("SELECT count(*) FROM outboxq_jobs WHERE workflow_id = %s", (workflow_id,)).fetchone()[0] == 0
    assert {e["workflow_id"] for e in _effects(db_url)} == {kept}


def test_a_failed_middle_step_fails_the_workflow_cancels_the_join_and_retry_runs_them(tables, tmp_path):
    db_url = tables
    with psycopg.connect(db_url) as conn:
        wf = Workflow("fails")
        fetch = wf.step("fetch", queue="wf-fetch", payload={"value": 1})
        left = wf.step("left", queue="wf-left", payload={"fail": True}, after=[fetch])
        right = wf.step("right", queue="wf-right", payload={"value": 2}, after=[fetch])
        join = wf.step("join", queue="wf-join", payload={}, after=[left, right])
        wf.step("after-join", queue="wf-join", payload={}, after=[join])
        wf.step("cleanup", queue="wf-fan", payload={"value": 5}, after=[(left, "run")])
        workflow_id = wf.enqueue(conn)
        conn.commit()
    workers = _workers(db_url, tmp_path / "w.log", count=1)
    try:
        wait_for(lambda: _statuses(db_url, workflow_id) == {
            "fetch": "done", "left": "dead", "right": "done", "join": "cancelled", "after-join": "cancelled",
            "cleanup": "done"}, timeout=60)
        with psycopg.connect(db_url) as c:
            info = get_workflow(c, workflow_id)
            assert info.status == "failed"
            steps = {s.name: s for s in info.steps}
            assert "fails as asked" in steps["left"].last_error
            assert "is dead" in steps["join"].waiting_reason
            # the clean-up step ran after the failure and saw it as a parent without result
            assert {e["step"]: e["parents"] for e in _effects(db_url)}["cleanup"] == {"left": None}
            # retry: the dead step again, the steps cancelled because of it wait again; it fails again
            assert retry_workflow(c, workflow_id) == {"retried": 1, "waiting": 2}
            c.commit()
        wait_for(lambda: _statuses(db_url, workflow_id)["join"] == "cancelled"
                 and _statuses(db_url, workflow_id)["left"] == "dead", timeout=60)
    finally:
        stop_processes(*workers)
    assert {e["step"] for e in _effects(db_url)} == {"fetch", "right", "cleanup"}


def test_a_failed_workflow_retried_once_its_cause_is_gone_ends_done_and_its_join_sees_both(tables, tmp_path):
    db_url, fixed = tables, tmp_path / "fixed"
    with psycopg.connect(db_url) as conn:
        wf = Workflow("retried")
        fetch = wf.step("fetch", queue="wf-fetch", payload={"value": 1})
        left = wf.step("left", queue="wf-left", payload={"value": 10, "fail_until": str(fixed)}, after=[fetch])
        right = wf.step("right", queue="wf-right", payload={"value": 100}, after=[fetch])
        wf.step("join", queue="wf-join", payload={}, after=[left, right])
        workflow_id = wf.enqueue(conn)
        conn.commit()
    workers = _workers(db_url, tmp_path / "w.log", count=1)
    try:
        wait_for(lambda: _statuses(db_url, workflow_id) == {
            "fetch": "done", "left": "dead", "right": "done", "join": "cancelled"}, timeout=60)
        fixed.write_text("the downstream is back")
        with psycopg.connect(db_url) as c:
            assert get_workflow(c, workflow_id).status == "failed"
            assert retry_workflow(c, workflow_id) == {"retried": 1, "waiting": 1}
            c.commit()
        wait_for(lambda: set(_statuses(db_url, workflow_id).values()) == {"done"}, timeout=60)
    finally:
        stop_processes(*workers)
    with psycopg.connect(db_url) as c:
        assert get_workflow(c, workflow_id).status == "done"
    effects = {e["step"]: e for e in _effects(db_url)}
    assert sorted(e["step"] for e in _effects(db_url)) == ["fetch", "join", "left", "right"]  # each once
    assert effects["join"]["parents"] == {"left": {"step": "left", "value": 10},
                                          "right": {"step": "right", "value": 100}}


def test_a_workflow_cancelled_while_a_step_runs_commits_nothing_of_it_and_runs_nothing_after(tables, tmp_path):
    db_url = tables
    files = {name: str(tmp_path / name) for name in ("started", "gate", "outcome")}
    with psycopg.connect(db_url) as conn:
        wf = Workflow("cancelled-mid-run")
        slow = wf.step("slow", queue="wf-gated", payload={"value": 1, **files})
        following = wf.step("next", queue="wf-left", payload={"value": 2}, after=[slow])
        wf.step("last", queue="wf-join", payload={}, after=[following])
        workflow_id = wf.enqueue(conn)
        conn.commit()
    workers = _workers(db_url, tmp_path / "w.log", count=1)
    try:
        # the slow step is running, held at its gate before its ctx.transaction()
        wait_for(lambda: os.path.exists(files["started"]), timeout=60)
        assert _statuses(db_url, workflow_id) == {"slow": "running", "next": "waiting", "last": "waiting"}
        with psycopg.connect(db_url) as c:
            assert cancel_workflow(c, workflow_id) == 3
            c.commit()
        # the waiting steps at once; the running one once its worker's heartbeat sees the request (and revokes
        # the lease: the cancelled outcome written), while its handler still waits at the gate
        wait_for(lambda: set(_statuses(db_url, workflow_id).values()) == {"cancelled"}, timeout=60)
        assert not os.path.exists(files["outcome"])
        Path(files["gate"]).write_text("go")  # the handler now writes its effect: its lease must refuse it
        assert wait_for(lambda: os.path.exists(files["outcome"]) and Path(files["outcome"]).read_text(),
                        timeout=60) == "LeaseLost"
        # a barrier: a job enqueued after, on the queue of the step after the slow one, runs; had "next" been
        # released, the worker would have claimed it (older) by then
        with psycopg.connect(db_url) as c:
            barrier = enqueue(c, "wf-left", {"value": 3}).id
            c.commit()
        wait_for(lambda: _job_status(db_url, barrier) == "done", timeout=60)
    finally:
        stop_processes(*workers)
    with psycopg.connect(db_url) as c:
        info = get_workflow(c, workflow_id)
    assert info.status == "cancelled"
    steps = {s.name: s for s in info.steps}
    assert {n: (s.status, s.attempts) for n, s in steps.items()} == {
        "slow": ("cancelled", 1), "next": ("cancelled", 0), "last": ("cancelled", 0)}
    assert steps["slow"].result is None
    assert [e["job_id"] for e in _effects(db_url)] == [barrier]  # nothing of the workflow's steps


def _job_status(db_url: str, job_id: int) -> str:
    with psycopg.connect(db_url) as c:
        return get_job(c, job_id).status


def test_a_cancelled_workflow_runs_nothing_more_and_cannot_be_retried(tables, db_url, tmp_path):
    with psycopg.connect(db_url) as conn:
        workflow_id = _diamond("cancelled").enqueue(conn)
        conn.commit()
        assert cancel_workflow(conn, workflow_id) == 4
        conn.commit()
        assert get_workflow(conn, workflow_id).status == "cancelled"
        assert set(_statuses(db_url, workflow_id).values()) == {"cancelled"}
        with pytest.raises(InvalidTransition, match="cancelled"):
            retry_workflow(conn, workflow_id)
        conn.rollback()
        with pytest.raises(WorkflowNotFound):
            cancel_workflow(conn, workflow_id + 1000)
        conn.rollback()
    workers = _workers(db_url, tmp_path / "w.log", count=1)
    try:
        time.sleep(1.0)  # ten poll intervals: a running worker would have claimed a step by now
    finally:
        stop_processes(*workers)
    assert _effects(db_url) == []


def test_a_fan_out_of_a_thousand_steps_joins_once_with_every_result(tables, tmp_path):
    db_url = tables
    wf = Workflow("fan")
    root = wf.step("root", queue="wf-fetch", payload={"value": 0})
    leaves = [wf.step(f"leaf-{i}", queue="wf-fan", payload={"value": i}, after=[root]) for i in range(998)]
    wf.step("sum", queue="wf-sum", payload={}, after=leaves)
    with psycopg.connect(db_url) as conn:
        started = time.monotonic()
        workflow_id = wf.enqueue(conn)
        written_s = time.monotonic() - started
        conn.commit()
    # (a bound against a quadratic write, not a benchmark: bench/workflow_cost.py wrote and committed this shape
    # in 64-128 ms on a loaded 2-core machine, docs/workflows.md)
    assert written_s < 3, written_s
    workers = _workers(db_url, tmp_path / "w.log")
    try:
        wait_for(lambda: _statuses(db_url, workflow_id)["sum"] == "done", timeout=120)
    finally:
        stop_processes(*workers)
    with psycopg.connect(db_url) as c:
        info = get_workflow(c, workflow_id)
    assert info.status == "done" and len(info.steps) == 1000
    assert {s.name: s.result for s in info.steps}["sum"] == {"sum": sum(range(998))}
    effects = _effects(db_url)
    assert len(effects) == 1000 and [e["parents"] for e in effects if e["step"] == "sum"] == [{"count": 998}]


def test_a_worker_killed_mid_workflow_costs_nothing(tables, tmp_path):
    db_url = tables
    with psycopg.connect(db_url) as conn:
        wf = Workflow("killed")
        fetch = wf.step("fetch", queue="wf-fetch", payload={"value": 1})
        slow = [wf.step(f"slow-{i}", queue="wf-left", payload={"value": i, "seconds": 1.5}, after=[fetch])
                for i in range(4)]
        wf.step("join", queue="wf-join", payload={}, after=slow)
        workflow_id = wf.enqueue(conn)
        conn.commit()
    workers = _workers(db_url, tmp_path / "w.log")
    try:
        def running_holder():
            with psycopg.connect(db_url) as c:
                row = c.execute("SELECT worker_id FROM outboxq_jobs WHERE workflow_id = %s AND status = 'running' "
                                "AND step LIKE 'slow-%%' LIMIT 1", (workflow_id,)).fetchone()
            return row and row[0]

        holder = wait_for(running_holder, timeout=30)
        victim = next(w for w in workers if holder.split(":")[1] == str(w.pid))
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        wait_for(lambda: set(_statuses(db_url, workflow_id).values()) == {"done"}, timeout=90)
    finally:
        stop_processes(*workers)
    effects = _effects(db_url)
    assert sorted(e["step"] for e in effects) == sorted(["fetch", "join", *[f"slow-{i}" for i in range(4)]])


def test_a_workflow_is_refused_whole_before_anything_is_written(db_url):
    wf = Workflow("bad")
    a = wf.step("a", queue="wf-fetch")
    with pytest.raises(InvalidInput, match="two steps named"):
        wf.step("a", queue="wf-fetch")
    wf.step("b", queue="wf-fetch", after=["c"])
    wf.step("c", queue="wf-fetch", after=["b", a])
    with psycopg.connect(db_url) as conn:
        with pytest.raises(InvalidInput, match="cycle"):
            wf.enqueue(conn)
        unknown = Workflow("unknown")
        unknown.step("x", queue="wf-fetch", after=["nowhere"])
        with pytest.raises(InvalidInput, match="nowhere"):
            unknown.enqueue(conn)
        with pytest.raises(InvalidInput, match="no steps"):
            Workflow("empty").enqueue(conn)
        with pytest.raises(InvalidInput, match="policy"):
            Workflow("p").step("x", queue="q", after=[(a, "sometimes")])
        with pytest.raises(InvalidInput, match="itself"):
            Workflow("s").step("x", queue="q", after=["x"])
        for bad in ("", "x" * 256, "nul\x00"):
            with pytest.raises(InvalidInput):
                Workflow(bad)
        assert conn.execute("SELECT count(*) FROM outboxq_jobs").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM outboxq_workflows").fetchone()[0] == 0


def test_enqueue_async_writes_the_workflow_in_the_callers_transaction(db_url):
    wf = _diamond("async")

    async def scenario() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            rolled_back = await wf.enqueue_async(conn)
            await conn.rollback()
            kept = await wf.enqueue_async(conn)
            await conn.commit()
        return rolled_back, kept

    workflow_id, kept = asyncio.run(scenario())
    with psycopg.connect(db_url) as c:
        assert get_workflow(c, workflow_id) is None
    assert _statuses(db_url, kept) == {"fetch": "queued", "left": "waiting", "right": "waiting", "join": "waiting"}


def test_three_sequences_of_fifteen_under_three_workers_run_in_order_one_at_a_time(tables, tmp_path):
    db_url = tables
    with psycopg.connect(db_url) as conn:
        for n in range(15):  # interleaved, each in its own transaction
            for s in ("customer-1", "customer-2", "customer-3"):
                enqueue(conn, "seq", {"sequence": s, "n": n, "seconds": 0.02}, sequence=s)
                conn.commit()
    workers = _workers(db_url, tmp_path / "w.log", count=3)
    try:
        wait_for(lambda: _count(db_url, "SELECT count(*) FROM test_seq_runs") == 45, timeout=90)
    finally:
        stop_processes(*workers)
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        runs = c.execute("SELECT * FROM test_seq_runs ORDER BY started_at").fetchall()
    assert len({r["job_id"] for r in runs}) == len(runs) == 45  # none ran twice with its effects
    for s in ("customer-1", "customer-2", "customer-3"):
        mine = [r for r in runs if r["sequence"] == s]
        assert [r["n"] for r in mine] == list(range(15)), s
        for earlier, later in zip(mine, mine[1:], strict=False):
            assert earlier["ended_at"] <= later["started_at"], (s, earlier, later)  # one at a time


def _count(db_url: str, query: str) -> int:
    with psycopg.connect(db_url) as c:
        return c.execute(query).fetchone()[0]


def test_a_dead_job_holds_its_sequence_until_cancelled_or_retried_unless_continue(db_url):
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        first = enqueue(conn, "s", {}, sequence="acct-1")
        second = enqueue(conn, "s", {}, sequence="acct-1")
        loose = enqueue(conn, "s", {}, sequence="acct-2", on_failure="continue")
        after_loose = enqueue(conn, "s", {}, sequence="acct-2", on_failure="continue")
        conn.commit()
        assert first.status == "queued" and second.status == "waiting" and after_loose.status == "waiting"
        conn.execute("UPDATE outboxq_jobs SET status = 'dead', finished_at = now() WHERE id = ANY(%s)",
                     ([first.id, loose.id],))
        conn.commit()
        promote.run_once(conn)
        held = get_job(conn, second.id)
        assert held.status == "waiting" and "is dead" in held.waiting_reason and held.sequence == "acct-1"
        assert get_job(conn, after_loose.id).status == "queued"  # on_failure="continue" goes on
        third = enqueue(conn, "s", {}, sequence="acct-1")
        conn.commit()
        assert third.status == "waiting"
        admin.cancel_job(conn, first.id)  # an operator gives up on the dead job: the sequence goes on
        conn.commit()
        promote.run_once(conn)
        assert get_job(conn, second.id).status == "queued"
        assert get_job(conn, third.id).status == "waiting"  # still one at a time

        # retried instead of cancelled: the dead job runs again first, and the sequence goes on once it is done
        dead, behind = sequence_held_by_a_dead_job(conn, "s", "acct-3")
        assert get_job(conn, behind.id).status == "waiting"
        assert admin.retry_job(conn, dead.id).status == "queued"
        conn.commit()
        promote.run_once(conn)
        assert get_job(conn, behind.id).status == "waiting"  # its turn comes after the retried job's
        conn.execute("UPDATE outboxq_jobs SET status = 'done', finished_at = now() WHERE id = %s", (dead.id,))
        conn.commit()
        promote.run_once(conn)
        assert get_job(conn, behind.id).status == "queued"


def test_a_dead_job_retried_runs_first_and_then_the_rest_of_its_sequence_in_order(tables, tmp_path):
    db_url, fixed = tables, tmp_path / "fixed"
    with psycopg.connect(db_url) as conn:
        # its first job fails for good (one attempt) until `fixed` exists, then takes 1 s (many promotion passes:
        # time for a wrongly released successor to start); each job in its own transaction
        jobs = [enqueue(conn, "seq", {"sequence": "acct-r", "n": 0, "seconds": 1.0, "fail_until": str(fixed)},
                        sequence="acct-r", max_attempts=1)]
        conn.commit()
        for n in range(1, 6):
            jobs.append(enqueue(conn, "seq", {"sequence": "acct-r", "n": n, "seconds": 0.02}, sequence="acct-r"))
            conn.commit()
    workers = _workers(db_url, tmp_path / "w.log", count=3)
    try:
        def held() -> bool:
            with psycopg.connect(db_url) as c:
                first, second = get_job(c, jobs[0].id), get_job(c, jobs[1].id)
            return first.status == "dead" and second.status == "waiting" and "is dead" in (second.waiting_reason or "")

        wait_for(held, timeout=60)
        assert _count(db_url, "SELECT count(*) FROM test_seq_runs") == 0  # nothing ran past the dead job
        fixed.write_text("the cause is gone")
        with psycopg.connect(db_url) as c:
            assert admin.retry_job(c, jobs[0].id).status == "queued"
            c.commit()
        wait_for(lambda: _count(db_url, "SELECT count(*) FROM test_seq_runs") == 6, timeout=60)
    finally:
        stop_processes(*workers)
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        runs = c.execute("SELECT * FROM test_seq_runs ORDER BY started_at").fetchall()
        assert [get_job(c, j.id).status for j in jobs] == ["done"] * 6
        assert get_job(c, jobs[0].id).attempts == 2
    assert [r["job_id"] for r in runs] == [j.id for j in jobs]  # the retried job first, then the rest in order
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert earlier["ended_at"] <= later["started_at"], (earlier, later)  # one at a time


def test_a_sequence_needs_a_transaction_and_a_valid_name(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(InvalidInput, match="needs a transaction"):
            enqueue(conn, "s", {}, sequence="a")
        with conn.transaction():
            assert enqueue(conn, "s", {}, sequence="a").status == "queued"
    with psycopg.connect(db_url) as conn:
        for bad in ("", "x" * 256, "\x00", 7):
            with pytest.raises(InvalidInput, match="sequence"):
                enqueue(conn, "s", {}, sequence=bad)
        with pytest.raises(InvalidInput, match="on_failure"):
            enqueue(conn, "s", {}, sequence="a", on_failure="later")
        with pytest.raises(InvalidInput, match="sequence"):
            enqueue(conn, "s", {}, on_failure="continue")


def test_the_workflows_command_lists_shows_cancels_and_refuses_a_retry_after_cancel(db_url):
    env = {**os.environ, "DATABASE_URL": db_url}

    def cli(*args: str, code: int = 0) -> str:
        done = subprocess.run([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "workflows", *args],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == code, done.stderr
        return done.stdout if code == 0 else done.stderr

    with psycopg.connect(db_url) as conn:
        ids = [_diamond(f"cli-{i}").enqueue(conn) for i in range(3)]
        conn.commit()
    table = cli()
    header, _, *rows = table.splitlines()
    assert header.split()[:4] == ["id", "name", "status", "steps"]
    assert [r.split()[0] for r in rows] == [str(i) for i in reversed(ids)]
    assert all(r.split()[2] == "running" for r in rows)
    assert f"workflow {ids[0]} (cli-0): running" in cli("show", str(ids[0]))
    assert [s["name"] for s in json.loads(cli("show", str(ids[0]), "--json"))["steps"]] == \
        ["fetch", "left", "right", "join"]
    assert "cancelled 4" in cli("cancel", str(ids[0]))
    assert "was cancelled" in cli("retry", str(ids[0]), code=1)
    assert "no workflow has id" in cli("show", "999999", code=1)


def test_set_result_stores_the_result_with_the_effects_and_refuses_what_cannot_be_stored(db_url):
    from outboxq.testing import TestQueue
    from outboxq.workers.registry import Consumer, register

    def good(payload, ctx):
        with ctx.transaction() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS test_set_result (n int)")
            conn.execute("INSERT INTO test_set_result VALUES (1)")
            ctx.set_result({"rows": 1})

    def unstorable(payload, ctx):
        with ctx.transaction() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS test_set_result (n int)")
            conn.execute("INSERT INTO test_set_result VALUES (2)")
            ctx.set_result(float("nan"))

    def outside(payload, ctx):
        ctx.set_result(1)

    for queue, handler in (("sr-good", good), ("sr-nan", unstorable), ("sr-outside", outside)):
        register(Consumer(queue, handler, max_attempts=1))
    with psycopg.connect(db_url) as conn:
        jobs = {q: enqueue(conn, q, {}).id for q in ("sr-good", "sr-nan", "sr-outside")}
        conn.commit()
    queue = TestQueue(db_url)
    queue.run_one("sr-good")
    for q in ("sr-nan", "sr-outside"):
        queue.drain(q, expect_success=False)
    with psycopg.connect(db_url) as conn:
        stored = {q: get_job(conn, i) for q, i in jobs.items()}
        rows = [r[0] for r in conn.execute("SELECT n FROM test_set_result ORDER BY n")]
    assert stored["sr-good"].status == "done" and stored["sr-good"].result == {"rows": 1}
    assert stored["sr-nan"].status == "dead" and "result not storable" in stored["sr-nan"].last_error
    assert rows == [1]  # the refused result's effects were rolled back with it
    assert stored["sr-outside"].status == "dead" and "inside `with ctx.transaction():`" in stored["sr-outside"].last_error

"""The flow control of a worker (workers/flow.py, workers/key_turns.py, workers/keyless.py) on its own: its
decisions (how many jobs to claim, from which keys, whether a queue is claimed again at once, which completions
hand their slots over), its readings of the limits and its looks for keyless jobs, with no worker thread running
(on a real PostgreSQL where it reads the database). Flow control through running workers: test_flow_control.py."""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace

import psycopg
import pytest
from psycopg.rows import dict_row

from outboxq import enqueue_many
from outboxq.queue import limits
from outboxq.queue.sql import limits as limits_sql
from outboxq.workers.flow import LIMITED_RECHECK_S, FlowControl
from outboxq.workers.key_turns import KeyTurn, KeyTurns
from outboxq.workers.keyless import ADOPT_WINDOW
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.support import explain_prepared, plan_nodes, wait_for


def _fill(db_url, queue, payloads, **options):
    with psycopg.connect(db_url) as conn:
        jobs = enqueue_many(conn, queue, payloads, **options)
        conn.commit()
    return jobs


def _count(db_url, statement, *params):
    with psycopg.connect(db_url) as c:
        return c.execute(statement, params).fetchone()[0]


def _stored_limits(db_url, queue):
    with psycopg.connect(db_url) as conn:
        return limits.load(conn).get(queue)


def _flow(*consumers, url="postgresql://unused", **options):
    """A flow control of its own over a worker's state (the worker not started): batches of 100, 4 handlers,
    polled every second unless told otherwise."""
    options = {"batch_size": 100, "concurrency": 4, "poll_interval": 1.0, **options}
    worker = Worker(list(consumers), url=url, run_maintenance=False, listen=False, **options)
    return FlowControl(worker.state), worker.state


# ------------------------------------------------------------------ moved from test_flow_control.py

def test_the_look_for_keyless_jobs_reads_only_the_front_of_the_queue_through_its_indexes(db_url):
    """The look runs after every short per-key claim and every reading of the limits: planned once on the
    dispatcher's connection (while the queue was empty), it still reads the claim and retry indexes, a bounded
    window, once 20,000 keyed jobs wait: never the jobs table nor its history."""
    consumer = Consumer("flow_adopt_plan", lambda payload: None, global_concurrency=10, limit_by="tenant")
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    with worker.state.connect_for_claims() as conn:
        for _ in range(3):
            worker.dispatcher.flow.keyless._front_due.clear()
            assert worker.dispatcher.flow.adopt_keyless(conn, consumer) == 0
        _fill(db_url, "flow_adopt_plan", [{"tenant": f"t{i % 50}"} for i in range(20_000)],
              limit_keys=[f"t{i % 50}" for i in range(20_000)])
        conn.autocommit = False
        [plan] = explain_prepared(conn, limits_sql.job_keyless_window,
                                  {"queue": "flow_adopt_plan", "window": ADOPT_WINDOW})
        conn.rollback()
    scans = {(n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan) if n.get("Relation Name")}
    assert scans == {("Index Scan", "outboxq_jobs_claim_idx"), ("Index Scan", "outboxq_jobs_retry_idx")}, scans
    assert all(n.get("Plan Rows", 0) <= ADOPT_WINDOW for n in plan_nodes(plan) if n["Node Type"] == "Limit")


def test_a_look_at_the_newest_jobs_that_failed_reads_them_again(db_url, monkeypatch):
    """A look whose writing of the keys failed (connection lost, deadlock victim) does not move its place: the
    next look keys the same jobs."""
    consumer = Consumer("flow_adopt_retry", lambda payload: None, global_concurrency=5, limit_by="tenant")
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    flow = worker.dispatcher.flow
    keyless = flow.keyless
    with worker.state.connect_for_claims() as claims:
        flow.read_limits(claims)
        assert flow.adopt_keyless(claims, consumer) == 0  # (the first look finds where the newest start)
        [job] = _fill(db_url, "flow_adopt_retry", [{"tenant": "t1"}])
        written, failed = keyless._set_limit_keys, []

        def fail(conn, rows):
            if rows:
                failed.append(rows)
                raise psycopg.OperationalError("connection lost")

        def look():
            keyless._newest_due = 0.0
            return keyless.look_newest(claims, time.monotonic())

        def failing_look():
            with contextlib.suppress(psycopg.OperationalError):
                look()
            return failed
        monkeypatch.setattr(keyless, "_set_limit_keys", fail)
        assert [r["id"] for r in wait_for(failing_look, timeout=10)[0]] == [job.id]
        monkeypatch.setattr(keyless, "_set_limit_keys", written)
        assert wait_for(look, timeout=10) == {"flow_adopt_retry": 1}
    assert _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE id = %s AND limit_key = 't1'", job.id) == 1


def test_a_look_whose_place_is_past_the_servers_transaction_ids_starts_again(db_url):
    """A place beyond every transaction id the server has given (its ids went back: a failover to a standby
    behind it) would never see a new job: the look starts again from now."""
    consumer = Consumer("flow_adopt_ahead", lambda payload: None, global_concurrency=5, limit_by="tenant")
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    flow = worker.dispatcher.flow
    keyless = flow.keyless

    def look():
        keyless._newest_due = 0.0
        return keyless.look_newest(claims, time.monotonic())
    with worker.state.connect_for_claims() as claims:
        flow.read_limits(claims)
        keyless._newest_after["flow_adopt_ahead"] = (2**62, 0)
        assert look() == {}
        [job] = _fill(db_url, "flow_adopt_ahead", [{"tenant": "t1"}])
        assert wait_for(look, timeout=10) == {"flow_adopt_ahead": 1}
    assert _count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE id = %s AND limit_key = 't1'", job.id) == 1


def test_a_reset_while_workers_run_brings_back_what_their_consumers_declare(db_url):
    """An operator's reset deletes the queue's row; a running worker declares its consumer's limits again at its
    next reading of the limits (every few seconds), instead of claiming without any limit until it restarts."""
    consumer = Consumer("flow_reset", lambda payload: None, global_concurrency=2, limit_by="tenant")
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    with worker.state.connect_for_claims() as claims:
        worker.dispatcher.flow.read_limits(claims)
        with psycopg.connect(db_url) as conn:
            limits.set_limits(conn, "flow_reset", global_concurrency=5, set_concurrency=True)
            conn.commit()
        worker.dispatcher.flow.read_limits(claims)
        assert worker.state.limits["flow_reset"].global_concurrency == 5
        with psycopg.connect(db_url) as conn:
            assert limits.reset_limits(conn, "flow_reset")
            conn.commit()
        worker.dispatcher.flow.read_limits(claims)
    assert worker.state.limits["flow_reset"] == limits.QueueLimits("flow_reset", global_concurrency=2, per_key=True)
    assert _stored_limits(db_url, "flow_reset") == worker.state.limits["flow_reset"]


def test_per_key_follows_limit_by_even_in_limits_an_operator_set(db_url):
    """per_key comes from the consumer's limit_by (code): limits an operator set before any worker declared are
    stored per queue, and a starting worker turns them per key, keeping the operator's values; a consumer that
    drops limit_by turns per_key off, the operator's limits stay. A running worker leaves a row that exists as it
    is (two versions of a consumer side by side during a deployment would take turns rewriting it)."""
    with psycopg.connect(db_url) as conn:
        limits.set_limits(conn, "flow_op_first", global_concurrency=3, set_concurrency=True)
        conn.commit()
    keyed = Consumer("flow_op_first", lambda payload: None, global_concurrency=9, limit_by="tenant")
    worker = Worker([keyed], url=db_url, run_maintenance=False, listen=False)
    operator_per_key = limits.QueueLimits("flow_op_first", global_concurrency=3, per_key=True, source="operator")
    with worker.state.connect_for_claims() as claims:
        worker.dispatcher.flow.read_limits(claims)
        assert worker.state.limits["flow_op_first"] == operator_per_key
        plain = Consumer("flow_op_first", lambda payload: None)
        restarted = Worker([plain], url=db_url, run_maintenance=False, listen=False)
        with restarted.state.connect_for_claims() as other_claims:
            restarted.dispatcher.flow.read_limits(other_claims)
        worker.dispatcher.flow.read_limits(claims)  # (running: the row is there, it writes nothing)
    assert _stored_limits(db_url, "flow_op_first") == limits.QueueLimits(
        "flow_op_first", global_concurrency=3, per_key=False, source="operator")


def test_a_worker_starting_with_its_limits_already_stored_writes_nothing(db_url):
    """Workers that start together with the same consumers (a deployment) each declare their limits: only the
    first writes them; the others read them and neither update nor lock the row (which would make each wait
    for the one before it to commit). A consumer that declares other limits still writes them."""
    def start(consumer):
        worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
        with worker.state.connect_for_claims() as conn:
            worker.dispatcher.flow.read_limits(conn)
        return worker.state.limits["flow_declared"]

    def row():
        with psycopg.connect(db_url, row_factory=dict_row) as c:
            return c.execute("SELECT xmin::text, xmax::text, global_concurrency, rate_limit_count "
                             "FROM outboxq_queue_limits WHERE queue = 'flow_declared'").fetchone()

    assert start(Consumer("flow_declared", lambda p: None, global_concurrency=3, rate_limit="5/s")).limited
    first = row()
    again = start(Consumer("flow_declared", lambda p: None, global_concurrency=3, rate_limit="5/s"))
    assert row() == first and first["xmax"] == "0"  # not written, not even locked
    assert (again.global_concurrency, again.rate_limit) == (3, "5/s")
    changed = start(Consumer("flow_declared", lambda p: None, global_concurrency=4, rate_limit="5/s"))
    assert changed.global_concurrency == 4 and row()["xmin"] != first["xmin"]


@pytest.mark.parametrize("flow, most_held", [
    ({}, 200),  # no limit: two batches
    ({"global_concurrency": 10_000}, 400),  # cannot bind: two of its claims (200 each)
    ({"global_concurrency": 10_000, "limit_by": "tenant"}, 400),
    ({"global_concurrency": 300}, 200),  # the worker's buffer could make it bind: two batches, as before
    ({"rate_limit": "10000/s"}, 200),  # every start is counted: as before (and only idle handlers are claimed for)
])
def test_a_worker_holds_two_claims_of_a_limited_queue_whose_limit_cannot_bind(flow, most_held):
    """With one limited claim (up to what the worker may hold) in flight, the next full claim waited for every
    job before it to be written: the worker may hold two of them where nothing it holds can make the limit bind,
    and claims a whole one while one is being worked on."""
    consumer = Consumer("flow_two_claims", lambda payload: None, **flow)
    worker = Worker([consumer], url="postgresql://unused", batch_size=100, concurrency=4, run_maintenance=False,
                    listen=False)
    flow, state = worker.dispatcher.flow, worker.state
    queue_limits = consumer.limits if consumer.limits.limited else None
    assert flow.most_held(queue_limits) == most_held
    state.in_flight = {job_id: None for job_id in range(200)}  # a claim of 200 being worked on, none buffered
    assert flow.room(flow.most_held(queue_limits)) == most_held - 200


def test_a_limited_queue_holds_two_claims_only_while_the_workers_other_queues_are_idle():
    """Two of a limited queue's claims would leave no room for the worker's other queues (their claims see the
    worker holding more than two batches): the larger hold lasts while the other queues' last claims came back
    short, and ends when one of them is to be claimed again."""
    limited = Consumer("flow_two_claims_limited", lambda payload: None, global_concurrency=10_000)
    worker = Worker([limited, Consumer("flow_two_claims_plain", lambda payload: None)], url="postgresql://unused",
                    batch_size=100, concurrency=4, run_maintenance=False, listen=False)
    flow, state = worker.dispatcher.flow, worker.state
    state.idle_until["flow_two_claims_plain"] = 0.0  # to be claimed: it may have jobs
    assert flow.most_held(limited.limits) == state.max_in_flight == 200
    state.idle_until["flow_two_claims_plain"] = time.monotonic() + 60  # its last claim came back short
    assert flow.most_held(limited.limits) == state.max_in_flight_limited == 400


# ------------------------------------------------------------------ how many

@pytest.mark.parametrize("flow, expected", [
    ({}, 100),  # no limit: a batch
    ({"global_concurrency": 3}, 4),  # the limit can bind: one job per idle handler
    ({"rate_limit": "10000/s"}, 4),  # every start counted: one job per idle handler
    ({"global_concurrency": 10_000}, 200),  # cannot bind: a limited claim (limits.claim_size), not a batch
])
def test_a_queue_is_claimed_a_batch_per_idle_handler_or_a_limited_claim_as_its_limits_allow(flow, expected):
    consumer = Consumer("room_wanted", lambda payload: None, **flow)
    control, state = _flow(consumer)
    queue_limits = consumer.limits if consumer.limits.limited else None
    assert control.wanted(queue_limits) == expected
    state.in_flight = {job_id: None for job_id in range(4)}  # every handler busy
    assert control.wanted(queue_limits) == (0 if expected == 4 else expected)


def test_nothing_is_claimed_while_the_handlers_have_enough_claimed_work_to_start():
    control, state = _flow(Consumer("room_buffered", lambda payload: None))
    state.buffered = 25  # a quarter batch (more than the 4 handlers) unstarted
    assert control.wanted(None) == 0
    state.buffered = 24
    assert control.wanted(None) == 100


def test_the_handlers_wake_the_dispatcher_as_their_claimed_work_falls_below_the_refill_mark(db_url):
    """A claim is due once fewer jobs than the refill mark wait for a handler: the handler that takes the job
    crossing it wakes the dispatcher, which would otherwise claim only after the next completion is written."""
    gates = threading.Semaphore(0)

    def handler(payload):
        gates.acquire(timeout=30)

    consumer = Consumer("room_refill", handler)
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False, batch_size=8, concurrency=1)
    state = worker.state
    assert state.refill_below == 2  # max(handlers, a quarter batch)
    _fill(db_url, "room_refill", [{"n": n} for n in range(8)])
    with state.connect_for_claims() as conn:
        jobs = worker.dispatcher.claim(conn, consumer, 8)
    assert state.buffered == 8
    for job in jobs:
        state.work.put(job)
    state.wake.clear()
    worker.handlers.spawn()
    try:
        for left in range(7, 1, -1):  # the one handler takes a job, and waits in it until let go
            wait_for(lambda left=left: state.buffered == left)
            assert not state.wake.is_set(), f"woken with {left} jobs unstarted"
            gates.release()
        wait_for(lambda: state.buffered == 1)
        assert state.wake.is_set()
        assert worker.dispatcher.flow.wanted(None) == 8 * 2 - len(state.in_flight)
    finally:
        for _ in range(8):
            gates.release()
        worker.handlers.drain(10)


def test_a_per_key_queue_whose_limit_cannot_bind_holds_a_short_times_work():
    """Per key, what the worker holds runs before a key that arrives later: it holds limits.fair_hold's worth."""
    consumer = Consumer("room_fair", lambda payload: None, global_concurrency=10_000, limit_by="tenant")
    control, state = _flow(consumer)
    state.job_seconds["room_fair"] = 0.01
    hold = limits.fair_hold(state.concurrency, 0.01, control.most_held(consumer.limits))
    assert 0 < hold < state.limited_claim_size
    assert control.wanted(consumer.limits) == hold
    state.in_flight = {job_id: None for job_id in range(hold)}
    assert control.wanted(consumer.limits) == 0


# ------------------------------------------------------------------ after a claim

def test_a_short_claim_idles_its_queue_a_poll_interval_a_limited_one_only_a_moment_and_a_full_one_not_at_all():
    plain = Consumer("room_idle", lambda payload: None)
    limited = Consumer("room_idle_limited", lambda payload: None, global_concurrency=3)
    control, state = _flow(plain, limited)
    assert control.idle_after(None, plain, None, 100, 100, state.slots_freed) is None
    assert control.idle_after(None, plain, None, 100, 3, state.slots_freed) == state.poll_interval == 1.0
    assert control.idle_after(None, limited, limited.limits, 4, 1, state.slots_freed) == LIMITED_RECHECK_S
    # A slot freed while the claim ran (the completer's wake-up came before its short answer): at once.
    freed_before = state.slots_freed
    state.slots_freed += 1
    assert control.idle_after(None, limited, limited.limits, 4, 1, freed_before) is None


def test_a_per_key_claim_cut_short_over_fewer_keys_is_claimed_again_at_once_and_once_only(db_url):
    consumer = Consumer("room_turn", lambda payload: None, global_concurrency=10_000, limit_by="tenant")
    control, state = _flow(consumer, url=db_url)
    with state.connect_for_claims() as conn:
        control.read_limits(conn)
        control.adopt_keyless(conn, consumer)  # (nothing to key: the next looks wait a while)
        queue_limits = state.limits["room_turn"]
        turn = KeyTurn("room_turn", 40, "", max_keys=5)
        control.turn_ended(turn, 40)  # full: nothing to say
        assert control.idle_after(conn, consumer, queue_limits, 40, 40, state.slots_freed) is None
        control.turn_ended(turn, 30)  # short after 5 keys of the 104 it might have scanned
        assert control.idle_after(conn, consumer, queue_limits, 40, 30, state.slots_freed) is None
        assert control.idle_after(conn, consumer, queue_limits, 40, 30, state.slots_freed) == LIMITED_RECHECK_S
        control.turn_ended(KeyTurn("room_turn", 40, "", limits.key_budget(40)), 30)  # every key scanned: idle
        assert control.idle_after(conn, consumer, queue_limits, 40, 30, state.slots_freed) == LIMITED_RECHECK_S


def test_a_short_per_key_claim_that_keyed_jobs_is_claimed_again_at_once_and_so_is_another_queue_keyed(db_url):
    """After a short claim of a per-key queue the flow control looks for keyless jobs: where it gave some their
    key, the queue is claimed again at once, and so is another per-key queue whose newest jobs it keyed."""
    first = Consumer("room_keyed", lambda payload: None, global_concurrency=5, limit_by="tenant")
    other = Consumer("room_keyed_other", lambda payload: None, global_concurrency=5, limit_by="tenant")
    control, state = _flow(first, other, url=db_url)
    with state.connect_for_claims() as conn:
        control.read_limits(conn)
        assert control.adopt_keyless(conn, first) == 0  # (the first look finds where the newest start)
        [job] = _fill(db_url, "room_keyed", [{"tenant": "t1"}])  # no consumer registered: no key
        control.keyless._front_due.clear()
        assert control.idle_after(conn, first, state.limits["room_keyed"], 5, 0, state.slots_freed) is None
        assert _count(db_url, "SELECT limit_key FROM outboxq_jobs WHERE id = %s", job.id) == "t1"

        [newest] = _fill(db_url, "room_keyed_other", [{"tenant": "t2"}])
        state.idle_until["room_keyed_other"] = 1e12

        def other_keyed():
            control.keyless._newest_due = 0.0
            control.adopt_keyless(conn, first)
            return state.idle_until["room_keyed_other"] == 0.0
        wait_for(other_keyed, timeout=10)
        assert control.idle_after(conn, other, state.limits["room_keyed_other"], 5, 0, state.slots_freed) is None
    assert _count(db_url, "SELECT limit_key FROM outboxq_jobs WHERE id = %s", newest.id) == "t2"


# ------------------------------------------------------------------ the limits' readings

def test_the_limits_are_read_at_once_then_every_refresh_while_idle_and_every_two_while_busy():
    control, _ = _flow(Consumer("room_refresh", lambda payload: None))
    now = time.monotonic()
    assert not control.limits_known
    assert control.reading_due(now, idle=False) and not control.reading_due(now, idle=True)
    control._read_at = now
    assert control.limits_known
    assert not control.reading_due(now + limits.LIMITS_REFRESH_S - 0.01, idle=True)
    assert control.reading_due(now + limits.LIMITS_REFRESH_S, idle=True)
    assert not control.reading_due(now + limits.LIMITS_REFRESH_S, idle=False)
    assert control.reading_due(now + 2 * limits.LIMITS_REFRESH_S, idle=False)


# ------------------------------------------------------------------ per-key turns

def _rows(keys, resume_key):
    return [{"limit_key": k, "priority": 0, "run_at": 0, "id": i, "resume_key": resume_key}
            for i, k in enumerate(keys)]


def test_per_key_turns_resume_after_the_last_key_served_and_deepen_after_a_full_claim():
    turns = KeyTurns()
    first = turns.next_turn("q", 6, deep_turns=True, job_seconds=0.0001)
    assert (first.after_key, first.max_keys) == ("", limits.key_budget(6))  # nothing shown yet: every key
    ordered = turns.claimed(first, _rows("aabbcc", resume_key="c"))
    assert [r["limit_key"] for r in ordered] == list("abcabc")
    second = turns.next_turn("q", 6, deep_turns=True, job_seconds=0.0001)
    assert (second.after_key, second.max_keys) == ("c", 2)  # 2 jobs a key shown: turns of 4, 2 keys
    assert second.params() == {"after_key": "c", "max_keys": 2}
    # A depth is used once; where a key's limit can bind, never (a key at its limit would cut the claim short).
    assert turns.next_turn("q", 6, deep_turns=True, job_seconds=0.0001).max_keys == limits.key_budget(6)
    turns.claimed(second, _rows("aabbcc", resume_key="b"))
    third = turns.next_turn("q", 6, deep_turns=False, job_seconds=0.0001)
    assert (third.after_key, third.max_keys) == ("b", limits.key_budget(6))
    assert turns.next_turn("other", 6, deep_turns=True, job_seconds=0.0001).after_key == ""  # each queue its own


# ------------------------------------------------------------------ handovers

def _outcome(queue):
    return SimpleNamespace(job=SimpleNamespace(queue=queue))


@pytest.mark.parametrize("flow, hands_over", [
    ({"global_concurrency": 3}, True),  # binds within the worker, and nothing else
    ({"global_concurrency": 10_000}, False),  # cannot bind here: the counted claims go on
    ({"global_concurrency": 3, "rate_limit": "5/s"}, False),  # every start must be counted
    ({"global_concurrency": 3, "limit_by": "tenant"}, False),  # a key's slot is not another key's
])
def test_only_a_binding_global_concurrency_limit_hands_its_slots_over(flow, hands_over):
    consumer = Consumer("room_handover", lambda payload: None, **flow)
    control, state = _flow(consumer)
    state.limits = {"room_handover": consumer.limits}
    assert control.hands_over(consumer.limits) is hands_over
    done = [_outcome("room_handover"), _outcome("room_handover")]
    assert (control.handover_room(done, done) is not None) is hands_over


def test_a_handover_claims_no_more_than_the_handlers_idle_once_the_outcomes_are_written():
    limited = Consumer("room_handover_idle", lambda payload: None, global_concurrency=3)
    control, state = _flow(limited, Consumer("room_handover_plain", lambda payload: None))
    state.limits = {"room_handover_idle": limited.limits}
    done = [_outcome("room_handover_idle"), _outcome("room_handover_plain"), _outcome("room_handover_idle")]
    state.in_flight = {job_id: None for job_id in range(6)}  # 3 being written, 3 running: 1 handler idle
    room = control.handover_room(done, done)
    assert (room.queue, room.handed, room.limit) == ("room_handover_idle", [done[0], done[2]], 1)
    state.in_flight = {job_id: None for job_id in range(7)}  # none idle
    assert control.handover_room(done, done) is None
    assert control.handover_room([done[1]], done) is None  # no queue among them hands over

"""Depends-on ordering (behaviour 3): waiting until every dependency is done, reasons, admin retry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.rows import dict_row

from outboxq import enqueue, get_job
from outboxq.queue import admin
from outboxq.queue.jobs import JobStatus
from outboxq.testing import TestQueue
from outboxq.workers.maintenance import promote, prune
from outboxq.workers.registry import Consumer, register
from outboxq.workers.runner import Worker
from tests.handlers_runtime import isolated_registry  # noqa: F401
from tests.support import status_of, wait_for


@pytest.fixture
def dict_conn(db_url):
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        yield c


def test_job_waits_until_every_dependency_is_done_then_runs_after_them(db_url):
    order = []
    consumers = [Consumer(q, lambda p, ctx, q=q: order.append((q, p["k"]))) for q in ("fetch", "render")]
    with psycopg.connect(db_url) as conn:
        a = enqueue(conn, "fetch", {"k": "a"}, key="a", delay=0.6)  # the dependency runs later than it
        b = enqueue(conn, "fetch", {"k": "b"}, key="b")
        report = enqueue(conn, "render", {"k": "r"}, depends_on=[("fetch", "a"), ("fetch", "b")])
        conn.commit()
    assert report.status is JobStatus.WAITING
    worker = Worker(consumers, url=db_url, poll_interval=0.05).start()
    try:
        wait_for(lambda: status_of(db_url, b.id) == "done")
        assert status_of(db_url, report.id) == "waiting"  # one dependency done is not enough
        wait_for(lambda: status_of(db_url, report.id) == "done", timeout=10)
    finally:
        worker.stop(timeout=5)
    assert order.index(("render", "r")) > order.index(("fetch", "a"))
    assert order.index(("render", "r")) > order.index(("fetch", "b"))
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        assert status_of(db_url, a.id) == "done"
        assert get_job(c, report.id).waiting_reason is None


def test_dependency_already_done_at_enqueue_means_queued_at_once(dict_conn, db_url):
    register(Consumer("first", lambda p: "ok"))
    dep = enqueue(dict_conn, "first", {}, key="one")
    dict_conn.commit()
    TestQueue(db_url).run_one("first")
    job = enqueue(dict_conn, "second", {}, depends_on=[("first", "one")])
    dict_conn.commit()
    assert job.status is JobStatus.QUEUED and status_of(db_url, dep.id) == "done"


@pytest.mark.parametrize("how", ["dead", "cancelled"])
def test_waiting_job_says_why_when_a_dependency_is_dead_or_cancelled_and_admin_retry_releases_it(
        dict_conn, db_url, how):
    declines = [how == "dead"]

    def charge(payload, ctx):
        if declines.pop() if declines else False:
            raise RuntimeError("card declined")

    register(Consumer("charge", charge, max_attempts=1))
    register(Consumer("ship", lambda p: "shipped"))
    tq = TestQueue(db_url)
    dep = enqueue(dict_conn, "charge", {}, key="order-7")
    waiting = enqueue(dict_conn, "ship", {}, depends_on=[("charge", "order-7")])
    dict_conn.commit()
    if how == "dead":
        tq.run_job("charge", dep.id, expect_success=False)
    else:
        admin.cancel_job(dict_conn, dep.id)
        dict_conn.commit()
    assert status_of(db_url, dep.id) == how

    assert promote.run_once(dict_conn) == {"released": 0, "reasons_changed": 1, "cancelled": 0}
    job = get_job(dict_conn, waiting.id)
    assert job.status is JobStatus.WAITING
    assert job.waiting_reason == f"dependency {dep.id} (queue charge, key order-7) is {how}"
    assert promote.run_once(dict_conn) == {"released": 0, "reasons_changed": 0, "cancelled": 0}  # stable, no churn

    admin.retry_job(dict_conn, dep.id)
    dict_conn.commit()
    promote.run_once(dict_conn)
    assert get_job(dict_conn, waiting.id).waiting_reason is None  # the dependency is queued again
    tq.run_one("charge")
    assert status_of(db_url, waiting.id) == "queued"  # released by the dependency's completion
    assert tq.run_one("ship") == "shipped"


def test_consumer_depends_on_callable_derives_dependencies_from_the_payload(dict_conn, db_url):
    register(Consumer("users", lambda p: None))
    register(Consumer("welcome_email", lambda p: p["user"],
                      depends_on=lambda payload: [("users", f"user-{payload['user']}")]))
    user = enqueue(dict_conn, "users", {}, key="user-42")
    email = enqueue(dict_conn, "welcome_email", {"user": 42})
    dict_conn.commit()
    assert email.status is JobStatus.WAITING
    deps = dict_conn.execute("SELECT depends_on_id FROM outboxq_job_dependencies WHERE job_id = %s",
                             (email.id,)).fetchall()
    assert deps == [{"depends_on_id": user.id}]
    tq = TestQueue(db_url)
    with pytest.raises(LookupError):
        tq.run_one("welcome_email")  # not ready
    tq.run_one("users")
    assert tq.run_one("welcome_email") == 42


def test_promote_is_the_safety_net_for_a_dependency_finished_before_its_dependent_committed(db_url):
    """The dependent's transaction was open while the dependency completed: promote releases it."""
    register(Consumer("dep", lambda p: None))
    with psycopg.connect(db_url, row_factory=dict_row) as setup:
        dep = enqueue(setup, "dep", {}, key="d")
        setup.commit()
        with psycopg.connect(db_url, row_factory=dict_row) as producer:
            waiting = enqueue(producer, "after", {}, depends_on=[("dep", "d")])  # sees dep queued
            TestQueue(db_url).run_one("dep")  # completes while the producer's transaction is open
            producer.commit()
        assert status_of(db_url, waiting.id) == "waiting"
        assert promote.run_once(setup)["released"] == 1
        assert status_of(db_url, waiting.id) == "queued"
        assert status_of(db_url, dep.id) == "done"


def test_prune_keeps_a_cancelled_dependency_while_a_job_still_waits_on_it(dict_conn, db_url):
    """Pruning it would look like 'dependency satisfied' and wrongly release the waiting job."""
    dep = enqueue(dict_conn, "charge", {}, key="c")
    waiting = enqueue(dict_conn, "ship", {}, depends_on=[("charge", "c")])
    dict_conn.commit()
    admin.cancel_job(dict_conn, dep.id)
    dict_conn.commit()
    later = datetime.now(UTC) + timedelta(days=365)
    assert prune.run_once(dict_conn, now=later) == 0
    promote.run_once(dict_conn)
    assert status_of(db_url, waiting.id) == "waiting"
    admin.cancel_job(dict_conn, waiting.id)
    dict_conn.commit()
    assert prune.run_once(dict_conn, now=later) == 2  # both go once nothing waits any more


def test_on_dependency_failure_cancel_cancels_the_chain_and_run_releases(dict_conn, db_url):
    register(Consumer("charge", lambda p: None, max_attempts=1))
    dep = enqueue(dict_conn, "charge", {}, key="order-9")
    cancel_first = enqueue(dict_conn, "ship", {}, key="ship-9", depends_on=[("charge", "order-9")],
                           on_dependency_failure="cancel")
    cancel_second = enqueue(dict_conn, "notify", {}, depends_on=[("ship", "ship-9")],
                            on_dependency_failure="cancel")
    run_anyway = enqueue(dict_conn, "cleanup", {}, depends_on=[("charge", "order-9")], on_dependency_failure="run")
    waits = enqueue(dict_conn, "audit", {}, depends_on=[("charge", "order-9")])
    dict_conn.commit()
    admin.cancel_job(dict_conn, dep.id)
    dict_conn.commit()

    result = promote.run_once(dict_conn)
    assert result["cancelled"] == 2 and result["released"] == 1
    first, second = get_job(dict_conn, cancel_first.id), get_job(dict_conn, cancel_second.id)
    assert first.status is JobStatus.CANCELLED and f"dependency {dep.id}" in first.last_error
    assert second.status is JobStatus.CANCELLED and f"dependency {cancel_first.id}" in second.last_error
    assert get_job(dict_conn, run_anyway.id).status is JobStatus.QUEUED
    assert get_job(dict_conn, waits.id).status is JobStatus.WAITING  # "wait", the default, keeps waiting

    # Enqueued after the dependency failed: decided at once.
    late_cancel = enqueue(dict_conn, "ship", {}, depends_on=[("charge", "order-9")], on_dependency_failure="cancel")
    late_run = enqueue(dict_conn, "cleanup", {}, depends_on=[("charge", "order-9")], on_dependency_failure="run")
    dict_conn.commit()
    assert late_cancel.status is JobStatus.CANCELLED and late_run.status is JobStatus.QUEUED

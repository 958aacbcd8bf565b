"""Transactional enqueue on a real PostgreSQL: the outbox guarantees and the errors callers must see."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.orm import Session

from outboxq import JobStatus, enqueue, enqueue_many, get_job
from outboxq.db import create_engine
from outboxq.errors import DuplicateJob, InvalidInput, InvalidPayload, UnknownDependency


def count_jobs(url: str, queue: str | None = None) -> int:
    with psycopg.connect(url) as c:
        if queue is None:
            return c.execute("SELECT count(*) FROM outboxq_jobs").fetchone()[0]
        return c.execute("SELECT count(*) FROM outboxq_jobs WHERE queue = %s", (queue,)).fetchone()[0]


@pytest.fixture
def orders_table(db_url):
    """The user's own business table (outboxq's schema has none)."""
    with psycopg.connect(db_url) as c:
        c.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL, amount numeric NOT NULL)")
    return "orders"


def test_rolled_back_transaction_leaves_no_job(db_url, orders_table):
    with psycopg.connect(db_url) as conn:
        conn.execute("INSERT INTO orders (customer, amount) VALUES ('ann', 5)")
        job = enqueue(conn, "emails", {"to": "ann"})
        assert job.id > 0
        conn.rollback()
    assert count_jobs(db_url) == 0
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM orders").fetchone()[0] == 0


def test_job_is_visible_to_others_only_after_commit(db_url):
    with psycopg.connect(db_url) as writer, psycopg.connect(db_url) as reader:
        job = enqueue(writer, "emails", {"to": "bob"})
        assert get_job(reader, job.id) is None
        reader.rollback()
        writer.commit()
        seen = get_job(reader, job.id)
        assert seen is not None and seen.status is JobStatus.QUEUED and seen.payload == {"to": "bob"}


def test_enqueue_works_inside_a_sqlalchemy_session_and_connection(db_url, orders_table):
    engine = create_engine(db_url)
    with Session(engine) as session:
        session.execute(sqlalchemy.text("INSERT INTO orders (customer, amount) VALUES ('cy', 7)"))
        job = enqueue(session, "emails", {"to": "cy"}, key="cy-1")
        session.rollback()
    assert count_jobs(db_url) == 0
    with Session(engine) as session:
        job = enqueue(session, "emails", {"to": "cy"}, key="cy-1")
        session.commit()
    with engine.connect() as connection:
        other = enqueue(connection, "emails", [1, 2, 3])
        connection.commit()
        assert get_job(connection, job.id).key == "cy-1"
    engine.dispose()
    with psycopg.connect(db_url) as c:  # committed for everyone, not only visible on its own connection
        assert get_job(c, other.id).payload == [1, 2, 3]


def test_duplicate_key_is_a_clear_error_and_keeps_the_transaction_usable(conn):
    enqueue(conn, "emails", {"n": 1}, key="welcome-42")
    with pytest.raises(DuplicateJob, match="welcome-42"):
        enqueue(conn, "emails", {"n": 2}, key="welcome-42")
    # The same key in another queue is fine, and the transaction still works.
    enqueue(conn, "sms", {"n": 3}, key="welcome-42")
    conn.commit()
    assert conn.execute("SELECT count(*) AS n FROM outboxq_jobs").fetchone()["n"] == 2


def test_unknown_dependency_is_raised_before_anything_is_written(conn):
    enqueue(conn, "emails", {}, key="exists")
    with pytest.raises(UnknownDependency, match="missing"):
        enqueue(conn, "reports", {}, key="r1", depends_on=[("emails", "exists"), ("emails", "missing")])
    conn.commit()
    assert conn.execute("SELECT count(*) AS n FROM outboxq_jobs WHERE queue = 'reports'").fetchone()["n"] == 0


def test_job_with_unfinished_dependency_waits(conn):
    enqueue(conn, "emails", {}, key="first")
    waiting = enqueue(conn, "reports", {}, depends_on=[("emails", "first")])
    assert waiting.status is JobStatus.WAITING
    conn.commit()
    assert get_job(conn, waiting.id).status is JobStatus.WAITING


def test_enqueue_many_writes_all_in_one_statement_and_returns_them_in_order(conn):
    jobs = enqueue_many(conn, "bulk", [{"i": i} for i in range(1000)], priority=3)
    conn.commit()
    assert [j.payload["i"] for j in jobs] == list(range(1000))
    ids = [j.id for j in jobs]
    assert ids == sorted(ids)
    stored = conn.execute("SELECT id, payload FROM outboxq_jobs ORDER BY id").fetchall()
    assert [(r["id"], r["payload"]["i"]) for r in stored] == list(zip(ids, range(1000), strict=True))


def test_enqueue_many_with_an_existing_key_writes_nothing(conn):
    enqueue(conn, "bulk", {}, key="k2")
    conn.commit()
    with pytest.raises(DuplicateJob, match="k2"):
        enqueue_many(conn, "bulk", [{}, {}, {}], keys=["k1", "k2", "k3"])
    conn.commit()
    keys = [r["key"] for r in conn.execute("SELECT key FROM outboxq_jobs").fetchall()]
    assert keys == ["k2"]


def test_enqueue_many_rejects_a_key_repeated_within_the_batch(conn):
    with pytest.raises(DuplicateJob):
        enqueue_many(conn, "bulk", [{}, {}], keys=["same", "same"])
    assert conn.execute("SELECT count(*) AS n FROM outboxq_jobs").fetchone()["n"] == 0


def test_run_at_and_delay_set_when_the_job_may_run(conn):
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    at = enqueue(conn, "later", {}, run_at=later)
    delayed = enqueue(conn, "later", {}, delay=120)
    assert abs((at.run_at - later).total_seconds()) < 0.001
    assert 110 < (delayed.run_at - datetime.now(timezone.utc)).total_seconds() <= 121


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"queue": "bad queue!"}, "invalid queue name"),
        ({"queue": "x" * 129}, "invalid queue name"),
        ({"key": ""}, "invalid key"),
        ({"priority": 10**6}, "priority"),
        ({"delay": -1}, "delay"),
        ({"max_attempts": -2}, "max_attempts"),
        ({"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"run_at": datetime.now(timezone.utc), "delay": 3}, "either run_at or delay"),
    ],
)
def test_bad_arguments_are_clear_errors_and_write_nothing(conn, kwargs, message):
    queue = kwargs.pop("queue", "emails")
    with pytest.raises(InvalidInput, match=message):
        enqueue(conn, queue, {"ok": True}, **kwargs)
    conn.commit()
    assert conn.execute("SELECT count(*) AS n FROM outboxq_jobs").fetchone()["n"] == 0


def test_a_payload_that_is_not_json_is_rejected(conn):
    with pytest.raises(InvalidPayload, match="not JSON"):
        enqueue(conn, "emails", {"when": object()})
    with pytest.raises(InvalidPayload):
        enqueue(conn, "emails", float("nan"))


def test_enqueue_refuses_a_connection_it_cannot_use():
    with pytest.raises(InvalidInput, match="psycopg Connection"):
        enqueue(object(), "emails", {})


def test_get_job_returns_the_documented_fields(conn):
    job = enqueue(conn, "emails", {"a": 1}, key="k", max_attempts=3)
    conn.commit()
    got = get_job(conn, job.id)
    assert (got.id, got.queue, got.key, got.status, got.attempts, got.last_error, got.max_attempts) == (
        job.id, "emails", "k", JobStatus.QUEUED, 0, None, 3)
    assert get_job(conn, 999_999) is None


def test_enqueue_many_without_keys_returns_what_was_stored_and_notifies_once(db_url):
    """The key-less path (COPY with reserved ids) stores exactly the jobs it returns."""
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN outboxq_jobs")
        with psycopg.connect(db_url) as conn:
            jobs = enqueue_many(conn, "copied", [{"n": i} for i in range(500)] + [[1], "s", None],
                                delay=30, priority=3, max_attempts=4)
            conn.commit()
        stored = [get_job(listener, job.id) for job in jobs]
        scheduled_notifications = list(listener.notifies(timeout=0.5, stop_after=5))
        with psycopg.connect(db_url) as conn:
            enqueue_many(conn, "copied", list(range(100)))
            conn.commit()
        ready_notifications = list(listener.notifies(timeout=2, stop_after=1))
    assert [s.payload for s in stored] == [{"n": i} for i in range(500)] + [[1], "s", None]
    for job, row in zip(jobs, stored, strict=True):
        assert (row.queue, row.status, row.priority, row.max_attempts) == ("copied", JobStatus("queued"), 3, 4)
        assert (job.run_at, job.created_at) == (row.run_at, row.created_at)
        assert row.run_at - row.created_at == timedelta(seconds=30)
    assert len({job.id for job in jobs}) == 503
    assert scheduled_notifications == []  # scheduled jobs are not ready: no wake-up
    assert [n.payload for n in ready_notifications] == ["copied"]


def test_an_unknown_dependency_error_names_a_few_pairs_and_counts_the_rest(conn):
    missing = [("emails", f"k{i}") for i in range(500)]
    with pytest.raises(UnknownDependency) as refused:
        enqueue(conn, "invoices", {}, depends_on=missing)
    message = str(refused.value)
    assert "('emails', 'k0')" in message and "('emails', 'k4')" in message and "'k5'" not in message
    assert "and 495 more" in message and len(message) < 400
    assert refused.value.missing == missing  # the whole list stays on the exception for code to read

"""Uniqueness that ends: enqueue's `unique` ("forever", "active", a window) and `on_conflict`, race-free."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from outboxq import JobStatus, enqueue, enqueue_async, enqueue_many
from outboxq.errors import DuplicateJob, InvalidInput
from tests.support import wait_for


def finish(url: str, job_id: int, status: str = "done") -> None:
    """Move a job to a finished status as a worker would."""
    with psycopg.connect(url) as c:
        c.execute("UPDATE outboxq_jobs SET status = %s, finished_at = now() WHERE id = %s", (status, job_id))


def jobs_with_key(url: str, key: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as c:
        return c.execute("SELECT id, status FROM outboxq_jobs WHERE key = %s ORDER BY id", (key,)).fetchall()


def test_forever_key_is_refused_even_after_the_job_is_done(db_url, conn):
    first = enqueue(conn, "mail", {"n": 1}, key="k")
    conn.commit()
    finish(db_url, first.id)
    with pytest.raises(DuplicateJob):
        enqueue(conn, "mail", {"n": 2}, key="k")
    conn.rollback()
    assert [i for i, _ in jobs_with_key(db_url, "k")] == [first.id]


@pytest.mark.parametrize("final", ["done", "dead", "cancelled"])
def test_active_key_is_refused_while_unfinished_and_free_once_finished(db_url, conn, final):
    first = enqueue(conn, "mail", {"n": 1}, key="k", unique="active")
    conn.commit()
    with pytest.raises(DuplicateJob):
        enqueue(conn, "mail", {"n": 2}, key="k", unique="active")
    conn.rollback()
    finish(db_url, first.id, final)
    second = enqueue(conn, "mail", {"n": 2}, key="k", unique="active")
    conn.commit()
    assert second.id != first.id
    assert jobs_with_key(db_url, "k") == [(first.id, final), (second.id, "queued")]


def test_on_conflict_ignore_returns_the_holding_job_and_writes_nothing(db_url, conn):
    first = enqueue(conn, "mail", {"n": 1}, key="k", unique="active")
    conn.commit()
    again = enqueue(conn, "mail", {"n": 2}, key="k", unique="active", on_conflict="ignore")
    conn.commit()
    assert again.id == first.id and again.payload == {"n": 1} and again.status is JobStatus.QUEUED
    assert len(jobs_with_key(db_url, "k")) == 1


def test_window_refuses_within_the_window_and_accepts_after_it(db_url, conn):
    first = enqueue(conn, "mail", {"n": 1}, key="w", unique=timedelta(seconds=1))
    conn.commit()
    finish(db_url, first.id)  # finished or not, the window counts from creation
    with pytest.raises(DuplicateJob):
        enqueue(conn, "mail", {"n": 2}, key="w", unique=timedelta(seconds=1))
    conn.rollback()
    same = enqueue(conn, "mail", {"n": 2}, key="w", unique=timedelta(seconds=1), on_conflict="ignore")
    conn.commit()
    assert same.id == first.id
    time.sleep(1.1)
    later = enqueue(conn, "mail", {"n": 3}, key="w", unique=timedelta(seconds=1))
    conn.commit()
    assert [i for i, _ in jobs_with_key(db_url, "w")] == [first.id, later.id]


@pytest.mark.parametrize("unique", ["active", timedelta(minutes=5)])
def test_two_transactions_racing_on_one_key_never_both_succeed(db_url, unique):
    """The second transaction waits for the first to commit, then sees its job and is refused."""
    results: dict[str, object] = {}
    first_written = threading.Event()

    def second() -> None:
        first_written.wait()
        with psycopg.connect(db_url) as c2:
            try:
                results["second"] = enqueue(c2, "mail", {"n": 2}, key="race", unique=unique)
                c2.commit()
            except DuplicateJob as exc:
                results["second"] = exc

    with psycopg.connect(db_url) as c1:
        results["first"] = enqueue(c1, "mail", {"n": 1}, key="race", unique=unique)
        thread = threading.Thread(target=second)
        thread.start()
        first_written.set()
        wait_for(lambda: _waiting_on_a_lock(db_url), timeout=10)  # the second enqueue waits for the first
        assert thread.is_alive()
        c1.commit()
    thread.join(10)
    assert isinstance(results["second"], DuplicateJob)
    assert len(jobs_with_key(db_url, "race")) == 1


def test_enqueue_many_with_ignore_returns_existing_jobs_in_place(db_url, conn):
    held = enqueue(conn, "mail", {"n": 0}, key="b", unique="active")
    conn.commit()
    jobs = enqueue_many(conn, "mail", [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}], keys=["a", "b", None, "a"],
                        unique="active", on_conflict="ignore")
    conn.commit()
    assert jobs[1].id == held.id and jobs[1].payload == {"n": 0}
    assert jobs[0].id == jobs[3].id and jobs[0].payload == {"n": 1}
    assert jobs[2].key is None and jobs[2].id not in (held.id, jobs[0].id)
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM outboxq_jobs").fetchone()[0] == 3


def test_enqueue_many_raise_undoes_the_whole_call(db_url, conn):
    enqueue(conn, "mail", {"n": 0}, key="b", unique="active")
    conn.commit()
    with pytest.raises(DuplicateJob):
        enqueue_many(conn, "mail", [{"n": 1}, {"n": 2}], keys=["a", "b"], unique="active")
    conn.commit()  # the caller commits what else it did: nothing of the refused call is left
    assert jobs_with_key(db_url, "a") == []


def test_enqueue_many_window(db_url, conn):
    enqueue(conn, "mail", {"n": 0}, key="b", unique=timedelta(minutes=1))
    conn.commit()
    with pytest.raises(DuplicateJob):
        enqueue_many(conn, "mail", [{"n": 1}, {"n": 2}], keys=["a", "b"], unique=timedelta(minutes=1))
    conn.rollback()
    jobs = enqueue_many(conn, "mail", [{"n": 1}, {"n": 2}], keys=["a", "b"], unique=timedelta(minutes=1),
                        on_conflict="ignore")
    conn.commit()
    assert jobs[1].payload == {"n": 0} and jobs[0].payload == {"n": 1}


def test_async_enqueue_takes_the_same_options(db_url):
    async def scenario():
        async with await psycopg.AsyncConnection.connect(db_url) as aconn:
            first = await enqueue_async(aconn, "mail", {"n": 1}, key="x", unique="active")
            again = await enqueue_async(aconn, "mail", {"n": 2}, key="x", unique="active", on_conflict="ignore")
            await aconn.commit()
        return first, again

    first, again = asyncio.run(scenario())
    assert again.id == first.id


@pytest.mark.parametrize("options, message", [
    ({"key": "k", "unique": "sometimes"}, "unique must be"),
    ({"key": "k", "unique": timedelta(0)}, "positive"),
    ({"key": "k", "on_conflict": "merge"}, "on_conflict must be"),
    ({"unique": "active"}, "give key="),
    ({"key": "k", "on_dependency_failure": "explode"}, "on_dependency_failure must be"),
])
def test_bad_uniqueness_options_are_refused_before_writing(db_url, conn, options, message):
    with pytest.raises(InvalidInput, match=message):
        enqueue(conn, "mail", {}, **options)
    conn.commit()
    assert jobs_with_key(db_url, "k") == []


def test_http_enqueue_takes_unique_and_on_conflict(db_url):
    from tests.api_support import api_client

    with api_client(db_url) as api:
        body = {"payload": {"n": 1}, "key": "h", "unique": "active"}
        first = api.post("/v1/queues/mail/jobs", json=body)
        assert first.status_code == 201, first.text
        refused = api.post("/v1/queues/mail/jobs", json=body)
        assert refused.status_code == 409
        same = api.post("/v1/queues/mail/jobs", json={**body, "on_conflict": "ignore"})
        assert same.status_code == 200 and same.json()["id"] == first.json()["id"]  # the holder, not written
        fresh = api.post("/v1/queues/mail/jobs", json={**body, "key": "h2", "on_conflict": "ignore"})
        assert fresh.status_code == 201 and fresh.json()["key"] == "h2"
        finish(db_url, first.json()["id"])
        again = api.post("/v1/queues/mail/jobs", json=body)
        assert again.status_code == 201 and again.json()["id"] != first.json()["id"]
        windowed = api.post("/v1/queues/mail/jobs", json={"payload": {}, "key": "w", "unique": 60})
        assert windowed.status_code == 201
        assert api.post("/v1/queues/mail/jobs", json={"payload": {}, "key": "w", "unique": 60}).status_code == 409
        for bad in ({"unique": "sometimes"}, {"unique": -1}, {"on_conflict": "merge"}, {"unique": "active"}):
            r = api.post("/v1/queues/mail/jobs", json={"payload": {}, **bad})
            assert r.status_code in (400, 422), (bad, r.text)
    assert len(jobs_with_key(db_url, "h")) == 2


def _waiting_on_a_lock(url: str) -> bool:
    """True while another session of the test's database waits on a lock (a blocked enqueue)."""
    with psycopg.connect(url) as conn:
        return bool(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                 "AND wait_event_type = 'Lock'").fetchone()[0])

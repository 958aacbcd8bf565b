"""The claim cursor (workers/claim_cursor.py): during a backlog a claim reads the claim index after the last job
the previous claim took, and nothing that sorts before the cursor is lost."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from outboxq import enqueue, enqueue_many
from outboxq.queue import sql
from outboxq.workers import claim_cursor
from outboxq.workers.claim_cursor import FROM_THE_FRONT
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker


@pytest.fixture
def worker(db_url, monkeypatch):
    # No read from the front falls due by itself during a test (a loaded machine may take a second between
    # two claims): the tests say when one is due.
    monkeypatch.setattr(claim_cursor, "FULL_SCAN_MIN_S", 3600.0)
    consumer = Consumer("cursor", lambda payload: None)
    w = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    with w.connect() as conn:
        yield w, consumer, conn


def _fill(db_url, n, **options):
    with psycopg.connect(db_url) as conn:
        jobs = enqueue_many(conn, "cursor", [{"n": i} for i in range(n)], **options)
        conn.commit()
    return [j.id for j in jobs]


def test_a_full_claim_moves_the_cursor_past_its_last_job_and_the_next_claim_starts_there(worker, db_url):
    w, consumer, conn = worker
    ids = _fill(db_url, 10)
    assert [j.id for j in w.claim(conn, consumer, 4)] == ids[:4]
    cursor = w.dispatcher.cursors.params("cursor")
    assert cursor["after_id"] == ids[3]
    # A job that sorts before the cursor (a higher priority) is not what a claim from the cursor reads ...
    urgent = enqueue(conn, "cursor", {"urgent": True}, priority=-1).id
    conn.commit()
    assert [j.id for j in w.claim(conn, consumer, 4)] == ids[4:8]
    # ... but when the claim from the cursor comes back short, the rest comes from the front, in one claim.
    assert sorted(j.id for j in w.claim(conn, consumer, 4)) == sorted([*ids[8:], urgent])
    assert w.dispatcher.cursors.params("cursor") is FROM_THE_FRONT  # short: the next claim reads from the front


def test_a_job_that_sorts_before_the_cursor_is_claimed_by_the_next_read_from_the_front(worker, db_url, monkeypatch):
    w, consumer, conn = worker
    ids = _fill(db_url, 20)
    assert [j.id for j in w.claim(conn, consumer, 5)] == ids[:5]
    # A job committed late with an old run_at (enqueued in a long transaction) sorts before the cursor.
    late = enqueue(conn, "cursor", {"late": True}, run_at=datetime.now(UTC) - timedelta(hours=1)).id
    conn.commit()
    assert late not in [j.id for j in w.claim(conn, consumer, 5)]  # from the cursor: full, the late job unseen
    monkeypatch.setattr(claim_cursor.time, "monotonic", lambda: 1e12)  # the read from the front is due
    claimed = [j.id for j in w.claim(conn, consumer, 5)]
    assert claimed[0] == late and claimed[1:] == ids[10:14]


def test_a_job_locked_while_the_cursor_passed_it_is_still_claimed(worker, db_url):
    w, consumer, conn = worker
    ids = _fill(db_url, 6)
    with psycopg.connect(db_url) as other:
        other.execute("SELECT id FROM outboxq_jobs WHERE id = %s FOR UPDATE", (ids[1],))
        assert [j.id for j in w.claim(conn, consumer, 3)] == [ids[0], ids[2], ids[3]]  # ids[1] skipped: locked
    # The lock is gone; the cursor is past ids[1], but the short claim from the cursor falls back to the front.
    assert sorted(j.id for j in w.claim(conn, consumer, 3)) == sorted([ids[1], ids[4], ids[5]])
    with psycopg.connect(db_url) as check:
        assert check.execute("SELECT count(*) FROM outboxq_jobs WHERE status = 'running'").fetchone()[0] == 6


def test_claims_from_the_cursor_read_only_past_it(worker, db_url):
    """With an old snapshot held (vacuum may remove nothing), a claim from the cursor reads none of the index
    entries of the jobs claimed before it; a claim from the front visits them all."""
    w, consumer, conn = worker
    _fill(db_url, 3000)
    with psycopg.connect(db_url) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM outboxq_queues").fetchone()
        for _ in range(5):
            assert len(w.claim(conn, consumer, 500)) == 500
        cursor = w.dispatcher.cursors.params("cursor")
        assert cursor is not FROM_THE_FRONT
        params = {"queue": "cursor", "limit": 100, "lease_token": uuid.uuid4(), "lease_s": 30.0, "worker_id": "w",
                  "default_max_attempts": 5}
        from_cursor = claim_index_entries_read(conn, {**params, **cursor})
        from_front = claim_index_entries_read(conn, {**params, **FROM_THE_FRONT})
    # From the front: the 2,500 claimed jobs' entries (their old row versions are still visible to the holder)
    # and the 100 it claims; from the cursor, the 100 (and the index's next entry).
    assert from_front >= 2600 and from_cursor <= 110, (from_front, from_cursor)


def claim_index_entries_read(conn, params) -> int:
    """Index entries the claim read from the claim index (the backend's statistics not yet reported count
    since the last report: the difference over the claim; rolled back)."""
    def entries():
        return conn.execute("SELECT pg_stat_get_xact_tuples_returned('outboxq_jobs_claim_idx'::regclass) AS n"
                            ).fetchone()["n"]
    before = entries()
    conn.execute(sql.job_claim_batch, params).fetchall()
    read = entries() - before
    conn.rollback()
    return read


def _record_commit_mode(db_url):
    """A trigger that writes the synchronous_commit of every transaction that claims a job."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE claim_commit_modes (mode text)")
        conn.execute("""CREATE FUNCTION record_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN INSERT INTO claim_commit_modes VALUES (current_setting('synchronous_commit')); RETURN NULL; END $$""")
        conn.execute("""CREATE TRIGGER record_commit_mode AFTER UPDATE ON outboxq_jobs FOR EACH STATEMENT
            EXECUTE FUNCTION record_commit_mode()""")


def _commit_modes(db_url):
    with psycopg.connect(db_url) as conn:
        return {r[0] for r in conn.execute("SELECT mode FROM claim_commit_modes").fetchall()}


def test_an_unlimited_claim_commits_without_waiting_for_the_disk_and_the_session_stays_synchronous(worker, db_url):
    w, consumer, conn = worker
    _record_commit_mode(db_url)
    _fill(db_url, 3)
    assert len(w.claim(conn, consumer, 3)) == 3
    assert _commit_modes(db_url) == {"off"}
    assert conn.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"] == "on"


def test_a_limited_claim_commits_synchronously(db_url):
    from outboxq.queue import limits as flow_limits

    consumer = Consumer("limited", lambda payload: None, global_concurrency=5)
    w = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    _record_commit_mode(db_url)
    with psycopg.connect(db_url) as c:
        enqueue_many(c, "limited", [{"n": i} for i in range(3)])
        c.commit()
    with w.connect() as conn:
        limits = flow_limits.QueueLimits(queue="limited", global_concurrency=5)
        flow_limits.declare(conn, limits)
        conn.commit()
        assert len(w.claim_limited(conn, consumer, limits, 3)) == 3
    assert _commit_modes(db_url) == {"on"}


def test_a_claim_whose_rest_fails_on_the_dispatchers_connection_hands_out_what_it_claimed(db_url, monkeypatch):
    """On the dispatcher's autocommit connection a short claim from the cursor has committed its jobs before
    the rest is claimed from the front: when that second statement fails, the jobs already claimed are handed
    out (not left running under a lease nobody holds until it expires)."""
    monkeypatch.setattr(claim_cursor, "FULL_SCAN_MIN_S", 3600.0)
    consumer = Consumer("cursor", lambda payload: None)
    w = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    ids = _fill(db_url, 6)
    with w.state.connect_for_claims() as conn:
        assert [j.id for j in w.claim(conn, consumer, 4)] == ids[:4]
        execute = conn.execute
        statements = []

        def the_second_fails(query, params=None, **options):
            statements.append(query)
            if len(statements) == 2:
                raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
            return execute(query, params, **options)

        conn.execute = the_second_fails  # type: ignore[method-assign]
        jobs = w.claim(conn, consumer, 4)
    assert len(statements) == 2 and [j.id for j in jobs] == ids[4:]
    assert set(ids[4:]) <= set(w.state.in_flight)

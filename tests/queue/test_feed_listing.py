"""The listing feed holds a queue's jobs of every status, the running ones too (read through the lease index, not
the feed index: migration 0012), each once, in feed order, whatever the page size and the status asked for; the
Spark source's bounds of a queue count its running jobs too."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outboxq.queue import feed, sql
from outboxq.queue.jobs import JobStatus
from outboxq.queue.sql import spark_stream as spark_stream_sql
from outboxq.workers.claim_cursor import FROM_THE_FRONT

STATUSES = [s.value for s in JobStatus]
SECRET = b"feed-listing-test-secret-32bytes"


def _listed(conn, page: int, status: str | None) -> list[int]:
    ids, marker = [], None
    while True:
        listed = feed.list_page(conn, SECRET, "feedq", marker=marker, limit=page, status=status)
        conn.commit()
        if not listed.items:
            return ids
        ids += [item.job.id for item in listed.items]
        marker = listed.next_marker


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(statuses=st.lists(st.sampled_from(STATUSES), min_size=1, max_size=25),
       commits_every=st.integers(1, 4), claimed=st.integers(0, 10), page=st.integers(1, 8),
       status=st.none() | st.sampled_from(STATUSES))
def test_every_job_is_listed_once_in_feed_order_running_ones_too(conn, statuses, commits_every, claimed, page,
                                                                  status):
    conn.execute("DELETE FROM outboxq_jobs WHERE queue = 'feedq'")
    conn.commit()
    written = []  # in feed order: each transaction's jobs by id, the transactions in commit order
    for index, job_status in enumerate(statuses):
        running = job_status == "running"
        row = conn.execute(
            "INSERT INTO outboxq_jobs (queue, status, payload, lease_token, lease_expires_at) "
            "VALUES ('feedq', %s, '{}'::jsonb, %s, CASE WHEN %s THEN now() + interval '1 minute' END) RETURNING id",
            (job_status, uuid.uuid4() if running else None, running)).fetchone()
        written.append(row["id"])
        if index % commits_every == 0:
            conn.commit()
    conn.commit()
    # Some queued jobs claimed by the workers' own statement: their rows become running versions.
    conn.execute(sql.job_claim_batch, {"queue": "feedq", "limit": claimed, "lease_token": uuid.uuid4(),
                                       "lease_s": 60.0, "worker_id": "w", "default_max_attempts": 5,
                                       **FROM_THE_FRONT}).fetchall()
    conn.commit()
    now = {r["id"]: r["status"] for r in conn.execute("SELECT id, status FROM outboxq_jobs WHERE queue = 'feedq'")}
    conn.commit()

    expected = [job_id for job_id in written if status is None or now[job_id] == status]
    assert _listed(conn, page, status) == expected


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(statuses=st.lists(st.sampled_from(STATUSES), min_size=0, max_size=12))
def test_the_spark_sources_bounds_of_a_queue_span_its_jobs_of_every_status(conn, statuses):
    conn.execute("DELETE FROM outboxq_jobs WHERE queue IN ('boundsq', 'otherq')")
    conn.execute("INSERT INTO outboxq_jobs (queue, status, payload) VALUES ('otherq', 'queued', '{}')")
    ids = [conn.execute(
        "INSERT INTO outboxq_jobs (queue, status, payload, lease_token, lease_expires_at) VALUES ('boundsq', %s, "
        "'{}'::jsonb, CASE WHEN %s THEN gen_random_uuid() END, CASE WHEN %s THEN now() + interval '1 minute' END) "
        "RETURNING id", (status, status == "running", status == "running")).fetchone()["id"] for status in statuses]
    conn.execute("INSERT INTO outboxq_jobs (queue, status, payload) VALUES ('otherq', 'queued', '{}')")
    conn.commit()
    no_filter = {"statuses": None, "created_from": None, "created_to": None, "finished_from": None,
                 "finished_to": None}
    bounds = conn.execute(spark_stream_sql.spark_source_id_range,
                          {"queue": "boundsq", "id_from": 0, "id_to": 2**63 - 1, **no_filter}).fetchone()
    newest = conn.execute(spark_stream_sql.spark_stream_newest_job, {"queue": "boundsq"}).fetchone()
    conn.commit()
    assert (bounds["low"], bounds["high"]) == ((min(ids), max(ids)) if ids else (None, None))
    assert newest["id"] == (max(ids) if ids else 0)

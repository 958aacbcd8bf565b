"""The listing feed holds a queue's jobs of every status, the running ones too (read through the lease index, not
the feed index: migration 0012), each once, in feed order, whatever the page size and the status asked for."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outboxq.queue import feed, sql
from outboxq.queue.jobs import JobStatus
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

"""A worker's Prometheus metrics, read over HTTP with prometheus-client's own parser."""

from __future__ import annotations

import urllib.request

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from outboxq import Worker, consumer, enqueue_many
from outboxq.workers.registry import get_consumer
from tests.support import wait_for


@consumer("metered", max_attempts=1)
def metered(payload: dict) -> None:
    """Fails the jobs whose payload says so."""
    if payload.get("fail"):
        raise ValueError("asked to fail")


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_worker_serves_counts_by_queue_and_outcome_and_durations(db_url):
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "metered", [{"fail": i % 4 == 0} for i in range(20)])
        conn.commit()
    worker = Worker([get_consumer("metered")], url=db_url, poll_interval=0.1, metrics_port=0).start()
    try:
        port = worker.metrics.port
        assert worker.metrics.host == "127.0.0.1"  # no authentication: never every interface by default
        done = ("outboxq_worker_jobs_finished_total", (("outcome", "succeeded"), ("queue", "metered")))
        failed = ("outboxq_worker_jobs_finished_total", (("outcome", "failed"), ("queue", "metered")))
        # Both outcomes counted: the completer may count the last failures in a later batch than the successes.
        samples = wait_for(lambda: (now := scrape(port)).get(done) == 15 and now.get(failed) == 5 and now,
                           timeout=20)
    finally:
        worker.stop(timeout=5)
    assert samples[("outboxq_worker_jobs_started_total", (("queue", "metered"),))] == 20
    assert samples[("outboxq_worker_jobs_finished_total", (("outcome", "failed"), ("queue", "metered")))] == 5
    assert samples[("outboxq_worker_handler_duration_seconds_count", (("queue", "metered"),))] == 20
    assert ("outboxq_worker_jobs_in_flight", ()) in samples

"""Flow control over HTTP: limits and usage in GET /v1/queues and /metrics, limits changed through the admin
API (validated, kept in PostgreSQL, applied by a running worker)."""

from __future__ import annotations

import threading

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from outboxq import enqueue_many
from outboxq.queue import limits
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.api_support import api_client, auth
from tests.support import claim_running, wait_for


@pytest.fixture
def api(db_url):
    with api_client(db_url, raise_server_exceptions=False) as client:
        yield client


def test_queues_list_each_limited_queues_limits_usage_and_busiest_keys(api, db_url):
    claim_running(db_url, "tenants", ["a", "a", "a", "b", "b", "c"])
    api.post("/v1/queues/plain/jobs", json={"payload": 1})
    queues = {q["queue"]: q for q in api.get("/v1/queues").json()["queues"]}
    assert queues["plain"]["limits"] is None
    assert queues["tenants"]["counts"]["running"] == 6
    assert queues["tenants"]["limits"] == {
        "queue": "tenants", "global_concurrency": 10, "rate_limit": None, "per_key": True, "source": "consumer",
        "running": 6, "recent_starts": 0,
        "busiest_keys": [{"key": "a", "running": 3}, {"key": "b", "running": 2}, {"key": "c", "running": 1}]}
    assert api.get("/v1/queues/tenants/limits", headers=auth("read")).json() == queues["tenants"]["limits"]


def test_limits_set_through_the_admin_api_are_kept_in_postgresql_and_partly_changeable(api, db_url):
    r = api.put("/v1/queues/downstream/limits", json={"global_concurrency": 4, "rate_limit": "10/s"})
    assert r.status_code == 200, r.text
    assert r.json() == {"queue": "downstream", "global_concurrency": 4, "rate_limit": "10/s", "per_key": False,
                             "source": "operator", "running": 0, "recent_starts": 0, "busiest_keys": []}
    # A queue limited before it has jobs is listed.
    assert {q["queue"]: q for q in api.get("/v1/queues").json()["queues"]}["downstream"]["limits"]["rate_limit"] == "10/s"
    # Only the field given changes; null removes a limit.
    assert api.put("/v1/queues/downstream/limits", json={"rate_limit": "2/m"}).json()["global_concurrency"] == 4
    r = api.put("/v1/queues/downstream/limits", json={"global_concurrency": None})
    assert (r.json()["global_concurrency"], r.json()["rate_limit"]) == (None, "2/m")
    with psycopg.connect(db_url) as conn:  # in the database, for every worker and after restarts
        stored = limits.load(conn)["downstream"]
    assert (stored.global_concurrency, stored.rate_limit, stored.source) == (None, "2/m", "operator")
    # Reset: back to what the consumers declare (none here), then 404 since there is nothing to reset.
    assert api.delete("/v1/queues/downstream/limits").status_code == 204
    assert api.get("/v1/queues/downstream/limits").status_code == 404
    assert api.delete("/v1/queues/downstream/limits").status_code == 404


@pytest.mark.parametrize(("body", "message"), [
    ({}, "give global_concurrency"),
    ({"global_concurrency": -1}, "global_concurrency"),
    ({"global_concurrency": 2**31}, "global_concurrency"),
    ({"global_concurrency": "3"}, "global_concurrency"),
    ({"global_concurrency": True}, "global_concurrency"),
    ({"global_concurrency": 1.5}, "global_concurrency"),
    ({"rate_limit": "10/d"}, "N/s, N/m or N/h"),
    ({"rate_limit": "ten/s"}, "N/s, N/m or N/h"),
    ({"rate_limit": "99999999999/s"}, "at most"),
    ({"rate_limit": 10}, "rate_limit"),
    ({"burst": 3}, "burst"),
])
def test_invalid_limits_get_a_422_that_says_what_to_fix_and_change_nothing(api, db_url, body, message):
    r = api.put("/v1/queues/guarded/limits", json=body)
    assert r.status_code == 422, r.text
    assert message in r.json()["error"]["message"]
    with psycopg.connect(db_url) as conn:
        assert "guarded" not in limits.load(conn)


def test_changing_limits_needs_the_admin_scope(db_url):
    with api_client(db_url, "read") as reader:
        r = reader.put("/v1/queues/q/limits", json={"global_concurrency": 1})
        assert r.status_code == 403 and "admin" in r.json()["error"]["message"]
        assert reader.delete("/v1/queues/q/limits").status_code == 403


class _RecordingWorker(Worker):
    """A worker that records what each of its dispatcher's limited claims returned."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.limited_claims: list[int] = []
        claim_limited = self.dispatcher.claim_limited

        def recording(conn, consumer, limits, limit):
            jobs = claim_limited(conn, consumer, limits, limit)
            self.limited_claims.append(len(jobs))
            return jobs

        self.dispatcher.claim_limited = recording


def test_a_limit_set_through_the_api_takes_effect_on_a_running_worker(api, db_url):
    release, started = threading.Event(), []

    def handler(payload):
        started.append(payload["n"])
        release.wait(30)

    worker = _RecordingWorker([Consumer("api-runtime", handler)], url=db_url, poll_interval=0.05,
                              run_maintenance=False, listen=False).start()
    try:
        assert api.put("/v1/queues/api-runtime/limits", json={"global_concurrency": 1}).status_code == 200
        # The worker applies the limit within its refresh interval; from then on it runs one job at a time.
        wait_for(lambda: worker.limited_claims, timeout=2 * limits.LIMITS_REFRESH_S + 2)
        with psycopg.connect(db_url) as conn:
            held = enqueue_many(conn, "api-runtime", [{"n": 1}, {"n": 2}])
            conn.commit()
        wait_for(lambda: started)
        claims_before = len(worker.limited_claims)
        wait_for(lambda: len(worker.limited_claims) >= claims_before + 3)
        assert len(started) == 1 and sorted(_status(db_url, job.id) for job in held) == ["queued", "running"]
        assert api.put("/v1/queues/api-runtime/limits", json={"global_concurrency": 2}).status_code == 200
        wait_for(lambda: len(started) == 2, timeout=2 * limits.LIMITS_REFRESH_S + 5)
        release.set()
        wait_for(lambda: all(_status(db_url, job.id) == "done" for job in held))
    finally:
        release.set()
        worker.stop(timeout=5)


def _status(db_url, job_id):
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT status FROM outboxq_jobs WHERE id = %s", (job_id,)).fetchone()[0]


def test_metrics_show_each_limited_queues_limits_usage_and_busiest_keys(db_url):
    claim_running(db_url, "tenants", ["a", "a", "b"])
    with api_client(db_url) as client:
        client.put("/v1/queues/paced/limits", json={"rate_limit": "120/m"})
    with api_client(db_url, "read", metrics_key_labels=True) as reader:
        r = reader.get("/metrics")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(r.text) for s in family.samples}
    assert samples[("outboxq_queue_limit_concurrency", (("queue", "tenants"),))] == 10
    assert samples[("outboxq_queue_limit_per_key", (("queue", "tenants"),))] == 1
    assert samples[("outboxq_queue_limit_running", (("queue", "tenants"),))] == 3
    assert samples[("outboxq_queue_limit_key_running", (("key", "a"), ("queue", "tenants")))] == 2
    assert samples[("outboxq_queue_limit_key_running", (("key", "b"), ("queue", "tenants")))] == 1
    assert samples[("outboxq_queue_limit_rate_per_second", (("queue", "paced"),))] == 2.0
    assert samples[("outboxq_queue_limit_window_starts", (("queue", "paced"),))] == 0
    assert ("outboxq_queue_limit_concurrency", (("queue", "paced"),)) not in samples


def test_limits_set_at_run_time_survive_a_worker_restart_that_declares_others(api, db_url):
    assert api.put("/v1/queues/api-restart/limits", json={"global_concurrency": 3}).status_code == 200
    # A worker starting with a consumer that declares other limits keeps the operator's.
    worker = Worker([Consumer("api-restart", lambda payload: None, global_concurrency=50, rate_limit="5/s")],
                    url=db_url, poll_interval=0.05, run_maintenance=False, listen=False).start()
    try:
        wait_for(lambda: "api-restart" in worker.state.limits)
        assert (worker.state.limits["api-restart"].global_concurrency, worker.state.limits["api-restart"].rate_limit) == (3, None)
    finally:
        worker.stop(timeout=5)
    assert api.get("/v1/queues/api-restart/limits").json()["source"] == "operator"
    # After a reset, the next worker to start declares its consumer's limits again.
    assert api.delete("/v1/queues/api-restart/limits").status_code == 204
    worker = Worker([Consumer("api-restart", lambda payload: None, global_concurrency=50, rate_limit="5/s")],
                    url=db_url, poll_interval=0.05, run_maintenance=False, listen=False).start()
    try:
        wait_for(lambda: "api-restart" in worker.state.limits)
    finally:
        worker.stop(timeout=5)
    declared = api.get("/v1/queues/api-restart/limits").json()
    assert (declared["global_concurrency"], declared["rate_limit"], declared["source"]) == (50, "5/s", "consumer")


def test_jobs_enqueued_over_http_take_their_limit_key_and_a_bad_one_gets_a_422(api, db_url):
    """`limit_key` on a job of the HTTP API is stored as enqueue(..., limit_key=) stores it, one by one and in a
    batch (each job its own); one too long or holding a NUL gets a 422 that names it, and nothing is written."""
    assert api.post("/v1/queues/tenants/jobs", json={"payload": {}, "limit_key": "acme"}).status_code == 201
    batch = api.post("/v1/queues/tenants/jobs/batch", json={"jobs": [
        {"payload": {}, "limit_key": "a"}, {"payload": {}, "limit_key": "b"}, {"payload": {}}]})
    assert batch.status_code == 201, batch.text
    with psycopg.connect(db_url) as conn:
        keys = [r[0] for r in conn.execute("SELECT limit_key FROM outboxq_jobs ORDER BY id").fetchall()]
    assert keys == ["acme", "a", "b", None]
    for bad in ("x" * 256, "a\x00b"):
        response = api.post("/v1/queues/tenants/jobs", json={"payload": {}, "limit_key": bad})
        assert response.status_code == 422 and "limit_key" in response.text, response.text
        response = api.post("/v1/queues/tenants/jobs/batch", json={"jobs": [{"payload": {}, "limit_key": bad}]})
        assert response.status_code == 422 and "limit_key" in response.text, response.text
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM outboxq_jobs").fetchone()[0] == 4

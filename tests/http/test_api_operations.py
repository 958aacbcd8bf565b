"""HTTP API: queues, errors, admin operations, stats, health, readiness, metrics."""

from __future__ import annotations

import os
import resource
import select
import socket
import struct
import threading
import time

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.api_support import api_client


@pytest.fixture
def api(db_url):
    with api_client(db_url, raise_server_exceptions=False) as client:
        yield client


def _make(db_url, job_id, status, error="boom"):
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outboxq_jobs SET status = %s, last_error = %s, attempts = 3 WHERE id = %s",
                     (status, error, job_id))


def test_queues_lists_counts_per_status_and_paused(api):
    api.post("/v1/queues/a/jobs", json={"payload": 1})
    api.post("/v1/queues/a/jobs", json={"payload": 2})
    assert api.post("/v1/queues/b/pause").json() == {"queue": "b", "paused": True}
    queues = {q["queue"]: q for q in api.get("/v1/queues").json()["queues"]}
    assert queues["a"]["counts"]["queued"] == 2 and queues["a"]["paused"] is False
    assert queues["b"]["paused"] is True
    assert api.post("/v1/queues/b/resume").json() == {"queue": "b", "paused": False}
    assert {q["queue"]: q["paused"] for q in api.get("/v1/queues").json()["queues"]}["b"] is False


def test_queue_counts_of_finished_jobs_cover_the_last_day_only(api, db_url):
    ids = [api.post("/v1/queues/w/jobs", json={"payload": i}).json()["id"] for i in range(3)]
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outboxq_jobs SET status = 'done', finished_at = now() - interval '2 days' "
                     "WHERE id = %s", (ids[0],))
        conn.execute("UPDATE outboxq_jobs SET status = 'done', finished_at = now() WHERE id = %s", (ids[1],))
    body = api.get("/v1/queues").json()
    assert body["finished_window_s"] == 86400
    counts = {q["queue"]: q["counts"] for q in body["queues"]}["w"]
    assert (counts["done"], counts["queued"]) == (1, 1)  # the job finished two days ago is not counted
    # A queue whose only jobs finished long ago is not listed.
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outboxq_jobs SET status = 'done', finished_at = now() - interval '2 days'")
    assert "w" not in {q["queue"] for q in api.get("/v1/queues").json()["queues"]}


def test_one_queue_is_counted_from_its_own_jobs_as_the_listing_counts_it(api, db_url):
    ids = [api.post("/v1/queues/one/jobs", json={"payload": i}).json()["id"] for i in range(4)]
    api.post("/v1/queues/other/jobs", json={"payload": 0})
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outboxq_jobs SET status = 'done', finished_at = now() - interval '2 days' "
                     "WHERE id = %s", (ids[0],))
        conn.execute("UPDATE outboxq_jobs SET status = 'dead', finished_at = now() WHERE id = %s", (ids[1],))
        conn.execute("UPDATE outboxq_jobs SET run_at = now() - interval '30 seconds' WHERE id = %s", (ids[2],))
    api.put("/v1/queues/one/limits", json={"global_concurrency": 3})
    one = api.get("/v1/queues/one").json()
    listed = {q["queue"]: q for q in api.get("/v1/queues").json()["queues"]}
    assert one["counts"] == listed["one"]["counts"] and one["counts"]["dead"] == 1 and one["counts"]["done"] == 0
    assert one["counts"]["queued"] == 2 and one["limits"]["global_concurrency"] == 3
    assert one["state"] == listed["one"]["state"] and 29 <= one["lag_s"] <= listed["one"]["lag_s"] + 1
    assert api.post("/v1/queues/one/pause").status_code == 200
    assert api.get("/v1/queues/one").json()["state"] == "paused"
    # A queue nobody has used: zero counts, idle; a name outside the pattern is a 422 that names it.
    unused = api.get("/v1/queues/nobody").json()
    assert unused["counts"]["queued"] == 0 and unused["state"] == "idle" and unused["limits"] is None
    bad = api.get("/v1/queues/" + "x" * 200)
    assert bad.status_code == 422 and "queue" in bad.text


def test_stats_windows_are_bounded_to_a_week(api):
    assert api.get("/v1/stats/retries", params={"age_days": 7}).status_code == 200
    too_long = api.get("/v1/stats/processing-time", params={"age_days": 30})
    assert too_long.status_code == 422 and "age_days" in too_long.text


def test_errors_retry_and_cancel(api, db_url):
    ids = [api.post("/v1/queues/q/jobs", json={"payload": i}).json()["id"] for i in range(4)]
    _make(db_url, ids[0], "dead", "it broke")
    _make(db_url, ids[1], "retrying", "flaky")
    errors = api.get("/v1/queues/q/errors").json()["items"]
    assert {(e["id"], e["last_error"]) for e in errors} == {(ids[0], "it broke"), (ids[1], "flaky")}
    retried = api.post(f"/v1/jobs/{ids[0]}/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "queued"
    assert api.post(f"/v1/jobs/{ids[2]}/retry").status_code == 409  # queued: nothing to retry
    assert api.post("/v1/jobs/987654/retry").status_code == 404
    assert api.post("/v1/queues/q/retry").json() == {"queue": "q", "retried": 1}
    cancelled = api.post(f"/v1/jobs/{ids[3]}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert api.post(f"/v1/jobs/{ids[3]}/cancel").status_code == 409
    assert api.post("/v1/jobs/987654/cancel").status_code == 404


def test_stats_endpoints(api, db_url):
    job_id = api.post("/v1/queues/q/jobs", json={"payload": 1}).json()["id"]
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outboxq_jobs SET status = 'done', attempts = 1, "
                     "attempt_started_at = now() - interval '2 seconds', finished_at = now() WHERE id = %s",
                     (job_id,))
    retries = api.get("/v1/stats/retries", params={"age_days": 1, "queue": "q"})
    assert retries.status_code == 200, retries.text
    times = api.get("/v1/stats/processing-time", params={"age_days": 1}).json()["items"]
    assert times and times[0]["queue"] == "q" and 1500 < times[0]["p50_ms"] < 2500
    assert api.get("/v1/stats/retries", params={"age_days": -1}).status_code == 422
    assert api.get("/v1/stats/retries", params={"queue": "bad name"}).status_code == 422


def test_health_probes_and_queue_health(api):
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    health = api.get("/v1/health").json()
    assert health["healthy"] is True and health["queues_in_error"] == []



def test_requests_after_the_servers_end_of_pooled_connections_succeed(api, db_url):
    """The pool lends a connection without a round trip while its socket is silent; one the server ended (its
    backend terminated, as in a restart) is found out and replaced before a request gets it, not a 503."""
    for _ in range(3):
        assert api.post("/v1/queues/pooled/jobs", json={"payload": 1}).status_code == 201
    with psycopg.connect(db_url, autocommit=True) as conn:
        ended = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                             "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                             "AND backend_type = 'client backend'").fetchone()[0]
        assert ended >= 1
        conn.execute("SELECT pg_sleep(0.2)")  # the terminated backends' last messages reach the sockets
    for i in range(5):
        r = api.post("/v1/queues/pooled/jobs", json={"payload": i})
        assert r.status_code == 201, r.text


def test_the_pool_check_works_for_connections_on_high_file_descriptors(db_url):
    """An application with over 1,024 files open gives its connections descriptors that select() refuses."""
    from outboxq.db import check_pooled_connection

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert conn.fileno() > 1024
            check_pooled_connection(conn)  # silent socket: lent without a round trip
            conn.execute("SELECT 1")
            with psycopg.connect(db_url, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
            readable = select.poll()
            readable.register(conn.fileno(), select.POLLIN)
            assert readable.poll(5000), "the server's last message never reached the socket"
            with pytest.raises(psycopg.OperationalError):
                check_pooled_connection(conn)
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class SilentFailoverProxy:
    """A TCP proxy to PostgreSQL. After fail_over(), the connections made before are silent (the server's side
    sends nothing more) and answer the client's next bytes with a reset, as a host that vanished does; new
    connections go through."""

    def __init__(self, db_url: str):
        self.db_url, self.generation = db_url, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def fail_over(self) -> None:
        self.generation += 1

    def _upstream(self) -> socket.socket:
        """A connection to the database's server: TCP, or its Unix socket (the embedded server's)."""
        info = conninfo_to_dict(self.db_url)
        host, port = info.get("host") or "127.0.0.1", int(info.get("port") or 5432)
        if host.startswith("/"):
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(f"{host}/.s.PGSQL.{port}")
            return upstream
        return socket.create_connection((host, port))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = self._upstream()
            for src, dst, resets in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pipe, args=(src, dst, self.generation, resets), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, generation: int, resets: bool) -> None:
        try:
            while data := src.recv(65536):
                if generation < self.generation:
                    if resets:  # the client wrote to a peer that is gone
                        src.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        src.close()
                    return
                dst.sendall(data)
        except OSError:
            pass


def test_the_pool_checks_with_a_round_trip_a_connection_idle_past_the_threshold(db_url, monkeypatch):
    """A server that vanished without a word leaves the socket silent: a connection idle for over
    POOL_CHECK_IDLE_S is checked with a round trip and replaced, so no request gets it."""
    from psycopg_pool import ConnectionPool

    from outboxq import db

    monkeypatch.setattr(db, "POOL_CHECK_IDLE_S", 0.2)
    proxy = SilentFailoverProxy(db_url)
    url = make_conninfo(db_url, host="127.0.0.1", port=proxy.port, sslmode="disable")
    with ConnectionPool(url, min_size=2, max_size=2, check=db.check_pooled_connection,
                        reset=db.pooled_connection_returned, timeout=10) as pool:
        pool.wait()
        with pool.connection() as conn:
            conn.execute("SELECT 1")
        proxy.fail_over()
        time.sleep(0.5)
        for _ in range(3):
            with pool.connection() as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
    proxy.listener.close()

def test_readyz_is_503_while_the_database_is_away(db_url):
    with api_client(db_url, database_url="postgresql://root@127.0.0.1:1/nowhere?connect_timeout=1") as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "database_unavailable"


def test_readyz_is_503_while_the_schema_is_not_current(pg_server_url, db_url):
    from outboxq.db import url_with_database

    name = db_url.rsplit("/", 1)[1] + "_empty"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        with api_client(db_url, database_url=url_with_database(pg_server_url, name)) as client:
            ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["error"]["code"] == "schema_out_of_date"
            assert "outboxq migrate" in ready.json()["error"]["message"]
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_metrics_are_prometheus_text_without_payloads(api, db_url):
    job_id = api.post("/v1/queues/m/jobs", json={"payload": {"secret": "do-not-leak"}}).json()["id"]
    api.post("/v1/queues/m/jobs", json={"payload": 2})
    api.post("/v1/queues/m/jobs", json={"payload": 3})
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outboxq_jobs SET status = 'done', finished_at = now() WHERE id = %s", (job_id,))
        conn.execute("UPDATE outboxq_jobs SET run_at = now() - interval '30 s' WHERE status = 'queued'")
    api.post("/v1/queues/p/pause")
    with api_client(db_url, "read") as reader:  # the read scope: /metrics is not public by default
        r = reader.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "do-not-leak" not in r.text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(r.text) for s in family.samples}
    assert samples[("outboxq_jobs", (("queue", "m"), ("status", "queued")))] == 2
    assert samples[("outboxq_jobs", (("queue", "m"), ("status", "running")))] == 0
    assert samples[("outboxq_queue_depth", (("queue", "m"),))] == 2
    assert 29 <= samples[("outboxq_queue_lag_seconds", (("queue", "m"),))] < 120
    assert samples[("outboxq_queue_paused", (("queue", "p"),))] == 1
    assert not any(name == "outboxq_jobs" and dict(labels).get("status") == "done" for name, labels in samples)


def test_spark_routes_validate_input(api):
    r = api.post("/v1/spark/batches", json={"queue": "q", "processor": "p", "output_table": "bad table"})
    assert r.status_code == 422 and "output_table" in r.json()["error"]["message"]
    r = api.post("/v1/spark/batches", json={"queue": "q", "processor": "p", "output_table": "t", "extra": 1})
    assert r.status_code == 422

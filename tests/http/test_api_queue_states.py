"""Each queue of GET /v1/queues says what it is doing, with a real worker: paused, failing (its attempts fail
and it backs off), limited (its concurrency limit is taken), idle (nothing to run) or running."""

from __future__ import annotations

import threading

import psycopg

from outboxq import enqueue
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.api_support import api_client, auth
from tests.support import status_of, wait_for


def test_queue_states_paused_failing_limited_idle_and_running(db_url):
    release = threading.Event()

    def down(payload, ctx):
        raise ConnectionError("the downstream is down")

    consumers = [Consumer("down", down, max_attempts=50, backoff_base=30.0),
                 Consumer("capped", lambda payload, ctx: release.wait(30), global_concurrency=1),
                 Consumer("quiet", lambda payload, ctx: None)]
    with psycopg.connect(db_url) as conn:
        enqueue(conn, "down", {})
        capped = [enqueue(conn, "capped", {"n": n}).id for n in range(2)]
        quiet = enqueue(conn, "quiet", {}).id
        enqueue(conn, "backlog", {})  # no worker runs it: it waits, queued
        enqueue(conn, "held", {})
        conn.commit()
    worker = Worker(consumers, url=db_url, poll_interval=0.1).start()
    try:
        with api_client(db_url, scope=None) as api:
            assert api.post("/v1/queues/held/pause", headers=auth("admin")).status_code == 200

            def states() -> dict[str, str]:
                return {q["queue"]: q["state"] for q in api.get("/v1/queues", headers=auth("read")).json()["queues"]}

            wait_for(lambda: status_of(db_url, quiet) == "done")
            wait_for(lambda: states().get("down") == "failing", timeout=20)
            wait_for(lambda: states().get("capped") == "limited", timeout=20)
            assert states() == {"down": "failing", "capped": "limited", "quiet": "idle", "backlog": "running",
                                "held": "paused"}
            release.set()
            wait_for(lambda: all(status_of(db_url, i) == "done" for i in capped), timeout=20)
            wait_for(lambda: states()["capped"] == "idle", timeout=20)
    finally:
        release.set()
        worker.stop(timeout=5)


def test_each_queue_says_how_long_its_oldest_ready_job_has_waited(db_url):
    with psycopg.connect(db_url) as conn:
        enqueue(conn, "lag-old", {"n": 1})
        enqueue(conn, "lag-later", {"n": 1}, delay=3600)  # not ready: no lag
        conn.execute("UPDATE outboxq_jobs SET run_at = now() - interval '90 seconds' WHERE queue = 'lag-old'")
        conn.commit()
    with api_client(db_url, scope=None) as api:
        queues = {q["queue"]: q for q in api.get("/v1/queues", headers=auth("read")).json()["queues"]}
    assert 90 <= queues["lag-old"]["lag_s"] < 120 and queues["lag-later"]["lag_s"] == 0

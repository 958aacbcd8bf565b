"""Payload checks and codecs, delivery hashes, idempotent conflicts, context propagation (7, 8, 9)."""

from __future__ import annotations

import logging
import pickle
import zlib

import psycopg
import pytest
from psycopg.rows import dict_row

from outboxq import enqueue, enqueue_many, get_job
from outboxq.errors import InvalidPayload
from outboxq.queue import context as job_context
from outboxq.queue.jobs import JobStatus
from outboxq.testing import TestQueue
from outboxq.workers.context import delivery_hash
from outboxq.workers.registry import Consumer, register
from outboxq.workers.runner import Worker
from tests.handlers_runtime import REQUEST_ID_VAR, isolated_registry, request_id  # noqa: F401
from tests.support import status_of, wait_for


def _count_jobs(url):
    with psycopg.connect(url) as c:
        return c.execute("SELECT count(*) FROM outboxq_jobs").fetchone()[0]


def test_valid_payload_rejects_a_bad_payload_at_enqueue_with_nothing_written(db_url):
    register(Consumer("invoices", lambda p: None, valid_payload=lambda p: isinstance(p, dict) and "id" in p))
    with psycopg.connect(db_url) as conn:
        enqueue(conn, "invoices", {"id": 1})
        with pytest.raises(InvalidPayload, match="valid_payload check of queue 'invoices'"):
            enqueue(conn, "invoices", {"amount": 3})
        with pytest.raises(InvalidPayload):
            enqueue_many(conn, "invoices", [{"id": 2}, {"no": "id"}])  # all or none
        conn.commit()  # the caller's transaction is intact: the good job commits
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT payload FROM outboxq_jobs").fetchall() == [({"id": 1},)]


def test_custom_codec_round_trips_through_the_database(db_url):
    seen = []

    def encode(payload):
        return zlib.compress(pickle.dumps(payload))

    def decode(data):
        return pickle.loads(zlib.decompress(data))

    register(Consumer("binary", lambda p: seen.append(p) or "decoded", encode=encode, decode=decode))
    value = {"set": {1, 2, 3}, "bytes": b"\x00\xff", "tuple": (1, "a")}  # not JSON-able
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        job = enqueue(conn, "binary", value)
        conn.commit()
        row = conn.execute("SELECT payload, payload_bytes FROM outboxq_jobs WHERE id = %s", (job.id,)).fetchone()
    assert row["payload"] is None and decode(bytes(row["payload_bytes"])) == value
    assert TestQueue(db_url).run_one("binary") == "decoded"  # a result is JSON, whatever the payload's codec
    assert seen == [value]


def test_str_codec_and_worker_threads_decode_too(db_url):
    seen = []
    consumer = register(Consumer("csv", lambda p, ctx: seen.append(p), encode=lambda p: ",".join(p),
                                 decode=lambda b: b.decode().split(",")))
    with psycopg.connect(db_url) as conn:
        enqueue(conn, "csv", ["a", "b", "ç"])
        conn.commit()
    worker = Worker([consumer], url=db_url, poll_interval=0.05).start()
    try:
        wait_for(lambda: seen)
    finally:
        worker.stop(timeout=5)
    assert seen == [["a", "b", "ç"]]


def test_delivery_hash_is_stable_across_attempts_and_differs_per_job_and_consumer(db_url):
    hashes = []

    def flaky(payload, ctx):
        hashes.append((ctx.job_id, ctx.attempt, ctx.delivery_hash))
        if ctx.attempt < 3:
            raise RuntimeError("try again")

    register(Consumer("hashes", flaky, consumer_id="billing-v1"))
    with psycopg.connect(db_url) as conn:
        first = enqueue(conn, "hashes", {})
        second = enqueue(conn, "hashes", {})
        conn.commit()
    tq = TestQueue(db_url)
    for _ in range(3):
        tq.run_job("hashes", first.id, expect_success=False)
    tq.run_job("hashes", second.id, expect_success=False)
    first_hashes = {h for job_id, _, h in hashes if job_id == first.id}
    assert [a for job_id, a, _ in hashes if job_id == first.id] == [1, 2, 3]
    assert first_hashes == {delivery_hash("billing-v1", first.id)}  # one hash for all three attempts
    assert delivery_hash("billing-v1", second.id) not in first_hashes
    assert delivery_hash("billing-v2", first.id) not in first_hashes
    assert status_of(db_url, first.id) == "done"


@pytest.mark.parametrize("idempotent", [True, False])
@pytest.mark.parametrize("in_transaction", [False, True])
def test_idempotent_conflicts_treats_the_handlers_own_unique_violation_as_success(db_url, idempotent,
                                                                                 in_transaction):
    def record_shipment(payload, ctx):
        statement = "INSERT INTO shipments (order_id) VALUES (%s)"
        if in_transaction:
            with ctx.transaction() as tx:
                tx.execute(statement, (payload["order"],))
        else:
            with psycopg.connect(db_url) as own:
                own.execute(statement, (payload["order"],))

    register(Consumer("ship", record_shipment, idempotent_conflicts=idempotent, max_attempts=3))
    with psycopg.connect(db_url) as conn:
        conn.execute("CREATE TABLE shipments (order_id int PRIMARY KEY)")
        first = enqueue(conn, "ship", {"order": 7})
        duplicate = enqueue(conn, "ship", {"order": 7})  # e.g. the same event delivered twice upstream
        conn.commit()
    tq = TestQueue(db_url)
    tq.run_job("ship", first.id)
    outcome = tq.run_job("ship", duplicate.id, expect_success=False)
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        job = get_job(c, duplicate.id)
        shipments = c.execute("SELECT count(*) AS n FROM shipments").fetchone()["n"]
    assert shipments == 1
    if idempotent:
        assert outcome.succeeded and job.status is JobStatus.DONE
    else:
        assert not outcome.succeeded and job.status is JobStatus.RETRYING
        assert job.last_error.startswith("UniqueViolation")


@pytest.fixture
def request_id_captured(monkeypatch):
    monkeypatch.setenv("OUTBOXQ_CONTEXT_VARS", f'["{REQUEST_ID_VAR}"]')
    from outboxq.settings import get_settings

    get_settings.cache_clear()
    job_context.configure()  # reads settings.context_vars
    yield
    job_context.configure([])


@pytest.mark.parametrize("is_async", [False, True])
def test_context_captured_at_enqueue_is_restored_in_the_handler_and_on_its_log_lines(
        db_url, caplog, request_id_captured, is_async):
    seen = []

    def body(ctx):
        seen.append((ctx.attempt, request_id.get("<unset>")))
        ctx.log.info("handling attempt %s", ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    if is_async:
        async def handler(payload, ctx):
            body(ctx)
    else:
        def handler(payload, ctx):
            body(ctx)

    consumer = Consumer("ctxq", handler, backoff_base=0.01, jitter=0)
    with psycopg.connect(db_url) as conn:
        token = request_id.set("req-42")
        try:
            job = enqueue(conn, "ctxq", {})
        finally:
            request_id.reset(token)
        enqueue(conn, "ctxq", {})  # enqueued outside the request: nothing captured
        conn.commit()
    assert job.context == {REQUEST_ID_VAR: "req-42"}
    with caplog.at_level(logging.INFO, logger="outboxq.worker"):
        worker = Worker([consumer], url=db_url, poll_interval=0.05, concurrency=1).start()
        try:
            wait_for(lambda: len(seen) == 3)
        finally:
            worker.stop(timeout=5)
    assert sorted(seen) == [(1, "<unset>"), (1, "req-42"), (2, "req-42")]
    assert request_id.get("<unset>") == "<unset>"  # restored only around the handler
    about_job = [r for r in caplog.records if getattr(r, "job_id", None) == job.id]
    messages = {r.getMessage() for r in about_job}
    assert "handling attempt 1" in messages and "handling attempt 2" in messages
    assert any("attempt 1 failed" in m for m in messages)  # the worker's own line about the job
    assert all(r.job_context == {REQUEST_ID_VAR: "req-42"} for r in about_job)


def test_a_handler_gets_its_payload_exactly_as_json_loads_reads_it(db_url):
    """The worker parses payloads with orjson; what orjson would read otherwise (an integer beyond 64 bits, which
    it turns into a float) must still arrive exact."""
    import json

    payloads = [{"big": 123456789012345678901234567890, "neg": -98765432109876543210987},
                {"max64": 9223372036854775807, "f": 0.1, "e": 1e300, "s": "é\u2603", "n": None, "l": [1, [2, {}]]},
                {"digits_in_text": "12345678901234567890123", "i": 7}, [1, 2.5, "x"], "text", 42]
    seen = []
    consumer = Consumer("exact", lambda payload: seen.append(payload))
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "exact", payloads)
        conn.commit()
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    worker.start()
    try:
        wait_for(lambda: len(seen) == len(payloads))
    finally:
        worker.stop()
    with psycopg.connect(db_url) as conn:  # what json.loads makes of the text PostgreSQL gives back
        stored = [json.loads(r[0]) for r in conn.execute("SELECT payload::text FROM outboxq_jobs").fetchall()]
    expected = sorted(json.dumps(p, sort_keys=True) for p in stored)
    assert sorted(json.dumps(p, sort_keys=True) for p in seen) == expected
    assert any(type(p) is dict and type(p.get("big")) is int for p in seen)

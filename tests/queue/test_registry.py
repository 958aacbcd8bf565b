"""The registry as an object: consumers, payload hooks and schedules belong to the registry a worker and
enqueue are given (the default one for the decorators), so two sets of handlers in one process stay apart."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from outboxq import InvalidPayload, Registry, Worker, consumer, default_registry, enqueue, get_job, periodic
from tests.support import status_of, wait_for


def test_a_consumer_of_another_registry_is_unknown_to_the_default_one_and_to_enqueue_without_it(db_url):
    registry = Registry()

    @consumer("reg-validated", registry=registry, valid_payload=lambda p: p.get("ok") is True)
    def handle(payload):
        return None

    assert registry.consumer("reg-validated").handler is handle
    assert default_registry.consumer("reg-validated") is None
    with psycopg.connect(db_url) as conn:
        with pytest.raises(InvalidPayload, match="valid_payload"):
            enqueue(conn, "reg-validated", {"ok": False}, registry=registry)
        job = enqueue(conn, "reg-validated", {"ok": False})  # the default registry has no hook for it
        conn.commit()
        assert get_job(conn, job.id).payload == {"ok": False}


def test_a_worker_runs_the_consumers_of_its_registry_only(db_url):
    registry, ran = Registry(), []

    @consumer("reg-run", registry=registry)
    def handle(payload):
        ran.append(payload["n"])

    with psycopg.connect(db_url) as conn:
        job = enqueue(conn, "reg-run", {"n": 1}, registry=registry)
        conn.commit()
    worker = Worker(registry=registry, url=db_url, poll_interval=0.05, listen=False).start()
    try:
        assert list(worker.consumers) == ["reg-run"]
        wait_for(lambda: status_of(db_url, job.id) == "done")
    finally:
        worker.stop(timeout=5)
    assert ran == [1]


def test_a_schedule_belongs_to_the_registry_it_was_given():
    registry = Registry()
    schedule = periodic("reg-periodic", every=timedelta(seconds=5), registry=registry)
    assert registry.schedules() == [schedule]
    assert all(s.name != "reg-periodic" for s in default_registry.schedules())


def test_a_copy_restores_the_registry_as_it_was():
    registry = Registry()
    saved = registry.copy()
    consumer("reg-temporary", registry=registry)(lambda payload: None)
    assert registry.consumer("reg-temporary") is not None
    registry.restore(saved)
    assert registry.consumer("reg-temporary") is None and registry.payload_hooks("reg-temporary") is None

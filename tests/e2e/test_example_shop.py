"""The example application (examples/shop, its own `app` package) proves the outbox through its HTTP routes:
rollback leaves neither order nor job; commit keeps both and the job runs once; outboxq's router answers
under /outboxq; its alembic history and outboxq's never touch each other."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.api_support import TOKEN_SPEC, auth
from tests.support import wait_for

SHOP = Path(__file__).resolve().parents[2] / "examples" / "shop"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _count(url: str, statement: str) -> int:
    with psycopg.connect(url) as c:
        return c.execute(statement).fetchone()[0]


@pytest.fixture
def shop(db_url):
    """The shop migrated (its own alembic history) and served by uvicorn from its folder."""
    env = {**os.environ, "DATABASE_URL": db_url, "OUTBOXQ_API_TOKENS": TOKEN_SPEC}
    migrated = subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=SHOP, env=env,
                              capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1",
                               "--port", str(port), "--log-level", "warning"], cwd=SHOP, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(base + "/outboxq/healthz"), timeout=30)
        with httpx.Client(base_url=base, timeout=10) as client:
            yield client, env
    finally:
        server.terminate()
        server.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_shops_and_outboxqs_migrations_keep_to_their_own_tables(shop, db_url):
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [("shop_0001",)]
        assert c.execute("SELECT count(*) FROM outboxq_alembic_version").fetchone()[0] == 1
    env = {**os.environ, "DATABASE_URL": db_url}
    again = subprocess.run([sys.executable, "-m", "outboxq.cli", "migrate"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [("shop_0001",)]


@pytest.mark.parametrize("route", ["/orders", "/orders/async"])
def test_rollback_leaves_nothing_and_commit_runs_the_job_once(shop, db_url, route):
    client, env = shop
    refused = client.post(route, json={"customer": "ann", "amount": "12.50", "fail_after_enqueue": True})
    assert refused.status_code == 409, refused.text
    assert _count(db_url, "SELECT count(*) FROM orders") == 0
    assert _count(db_url, "SELECT count(*) FROM outboxq_jobs") == 0

    placed = client.post(route, json={"customer": "ann", "amount": "12.50"})
    assert placed.status_code == 201, placed.text
    order_id, job_id = placed.json()["order_id"], placed.json()["job_id"]
    job = client.get(f"/outboxq/v1/jobs/{job_id}", headers=auth("read")).json()
    assert job["key"] == f"order-{order_id}" and job["status"] == "queued"

    worker = subprocess.Popen([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "worker",
                               "--handlers", "app.handlers", "--queues", "order-confirmation"], cwd=SHOP, env=env)
    try:
        wait_for(lambda: client.get(f"/outboxq/v1/jobs/{job_id}", headers=auth("read")).json()["status"] == "done",
                 timeout=90)  # (a worker process starting on a loaded machine)
    finally:
        worker.terminate()
        worker.wait(timeout=20)
    assert _count(db_url, f"SELECT count(*) FROM shop_effects WHERE job_id = {job_id}") == 1


BAD_ORDERS = [
    {"customer": "ada", "amount": -1},
    {"customer": "ada", "amount": "1.234"},
    {"customer": "", "amount": 1},
    {"amount": 1},
    {"customer": "ada", "amount": 1, "note": "unknown field"},
    {"customer": "a\x00da", "amount": 1},
]


def test_bad_order_input_writes_neither_order_nor_job(shop, db_url):
    client, _ = shop  # one shop for every body (each shop is a migration and a server start)
    for body in BAD_ORDERS:
        r = client.post("/orders", json=body)
        assert r.status_code == 422, (body, r.text)
        assert _count(db_url, "SELECT count(*) FROM orders") == 0
        assert _count(db_url, "SELECT count(*) FROM outboxq_jobs") == 0


def test_a_failing_enqueue_rolls_the_order_back(shop, db_url):
    client, _ = shop
    # The orders get ids 1 and 2 (a rolled-back insert still uses up its id); confirmation jobs with their
    # keys already exist, so each enqueue fails and takes its order down with it.
    for key in ("order-1", "order-2"):
        taken = client.post("/outboxq/v1/queues/order-confirmation/jobs", json={"payload": "x", "key": key},
                            headers=auth("enqueue"))
        assert taken.status_code == 201, taken.text
    for route, key in (("/orders", "order-1"), ("/orders/async", "order-2")):
        r = client.post(route, json={"customer": "ada", "amount": 5})
        assert r.status_code == 409 and key in r.text, r.text
    assert _count(db_url, "SELECT count(*) FROM orders") == 0
    assert _count(db_url, "SELECT count(*) FROM outboxq_jobs") == 2

"""Per-component database roles: each refuses what its component must not do, with a statement_timeout."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from outboxq import DuplicateJob, enqueue, enqueue_many
from outboxq.db import url_with_user
from outboxq.queue.roles import create_app_role, drop_app_role


@pytest.fixture
def role_url(db_url):
    """Create a role for a component on the test's database; returns a function giving its URL."""
    created = []

    def make(component: str, **options) -> str:
        role = f"outboxq_test_{component}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(db_url) as conn:
            create_app_role(conn, role, component=component, **options)
        created.append(role)
        return url_with_user(db_url, role)

    yield make
    with psycopg.connect(db_url, autocommit=True) as conn:
        for role in created:
            drop_app_role(conn, role)


def test_the_api_role_enqueues_but_cannot_delete_jobs_or_change_the_schema(db_url, role_url):
    url = role_url("api")
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "15s"
        job = enqueue(conn, "mail", {"n": 1}, key="a")
        conn.commit()
        # A refused keyed batch is undone with a savepoint: no DELETE needed, the transaction stays usable.
        with pytest.raises(DuplicateJob):
            enqueue_many(conn, "mail", [{"n": 2}, {"n": 3}], keys=["b", "a"])
        enqueue(conn, "mail", {"n": 4}, key="c")
        conn.commit()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM outboxq_jobs WHERE id = %s", (job.id,))
        conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("ALTER TABLE outboxq_jobs ADD COLUMN x int")
        conn.rollback()
        conn.execute("DELETE FROM outboxq_queue_limits WHERE queue = 'mail'")  # an operator's reset
        conn.commit()
    with psycopg.connect(db_url) as c:
        assert [r[0] for r in c.execute("SELECT key FROM outboxq_jobs ORDER BY id")] == ["a", "c"]


def test_the_worker_role_may_delete_and_has_its_own_limits(db_url, role_url):
    url = role_url("worker", statement_timeout_s=2, connection_limit=7)
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "2s"
        enqueue(conn, "mail", {})
        conn.execute("DELETE FROM outboxq_jobs")
        conn.commit()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(3)")
        conn.rollback()
        role = conn.execute("SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user").fetchone()[0]
    assert role == 7


def test_the_spark_role_may_create_output_tables_in_the_results_schema_only(db_url, role_url):
    url = role_url("spark", results_schema="outboxq_results")
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE outboxq_results.totals (k text)")
        conn.commit()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE public.outboxq_sneaky (k text)")
        conn.rollback()


def test_an_unknown_component_is_refused(db_url):
    with psycopg.connect(db_url) as conn, pytest.raises(ValueError, match="component must be one of"):
        create_app_role(conn, "outboxq_test_nobody", component="janitor")

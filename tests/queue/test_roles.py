"""Per-component database roles: each refuses what its component must not do, with a statement_timeout; what
PUBLIC still gives them, and `create-role --lock-down-public`, on a server of the test's own; passwords."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import tempfile
import types
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql as pgsql

from outboxq import DuplicateJob, enqueue, enqueue_many
from outboxq.cli import build_parser
from outboxq.db import url_with_database, url_with_user
from outboxq.queue import migrate
from outboxq.queue.roles import RoleExists, create_app_role, drop_app_role, public_reach


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


def test_an_existing_role_is_refused_unless_updated_and_an_update_takes_rights_away(db_url, role_url):
    url = role_url("worker")
    role = psycopg.conninfo.conninfo_to_dict(url)["user"]
    with psycopg.connect(db_url) as conn, pytest.raises(RoleExists, match="--update-existing"):
        create_app_role(conn, role, component="api")
    with psycopg.connect(db_url) as conn:
        assert create_app_role(conn, role, component="api", update_existing=True) is False
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "15s"  # the api's
        enqueue(conn, "mail", {})
        conn.commit()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the worker's DELETE is gone
            conn.execute("DELETE FROM outboxq_jobs")


def test_a_role_with_powers_no_outboxq_role_has_is_never_updated(db_url):
    role = f"outboxq_test_admin_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN CREATEROLE").format(pgsql.Identifier(role)))
        try:
            with pytest.raises(RoleExists, match="CREATEROLE"):
                create_app_role(conn, role, component="api", update_existing=True)
            assert conn.execute("SELECT rolcreaterole FROM pg_roles WHERE rolname = %s", (role,)).fetchone()[0]
        finally:
            drop_app_role(conn, role)


def test_a_role_keeps_connecting_to_its_database_when_public_no_longer_may(db_url, role_url, pg_server_url):
    url = role_url("api")
    database = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(pg_server_url, autocommit=True) as conn:  # the test's own database: ours to harden
        conn.execute(pgsql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(pgsql.Identifier(database)))
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM outboxq_jobs").fetchone()[0] == 0


def test_without_the_lock_down_the_role_may_still_do_what_public_may(db_url, role_url):
    url = role_url("api")
    role = psycopg.conninfo.conninfo_to_dict(url)["user"]
    with psycopg.connect(db_url) as conn:
        reach = public_reach(conn, role)
    assert reach and reach.temporary and "postgres" in reach.other_databases
    with psycopg.connect(url) as conn:  # which is why create-role says so (test_cli's note)
        conn.execute("CREATE TEMP TABLE scratch (n int)")


# ---------------------------------------------------------------- passwords and the command


def scram_verifies(verifier: str, password: str) -> bool:
    """Whether a SCRAM-SHA-256 verifier (pg_authid.rolpassword) was made from `password` (RFC 5802, 7677)."""
    mechanism, iterations_salt, keys = verifier.split("$")
    iterations, salt = iterations_salt.split(":")
    stored_key = keys.split(":")[0]
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    return mechanism == "SCRAM-SHA-256" and hashlib.sha256(client_key).digest() == base64.b64decode(stored_key)


def stored_password(url: str, role: str) -> str | None:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,)).fetchone()[0]


def create_role_command(*argv: str) -> int:
    """`outboxq create-role ...` in this process (main() would set up logging for the rest of the session)."""
    args = build_parser().parse_args(["create-role", *argv])
    return args.func(args)


@pytest.fixture
def role_name(db_url) -> Iterator[str]:
    """A fresh role name, the role dropped after the test (when created)."""
    role = f"outboxq_test_cli_{uuid.uuid4().hex[:8]}"
    yield role
    with psycopg.connect(db_url, autocommit=True) as conn:
        drop_app_role(conn, role)


def test_a_password_reaches_the_server_only_as_its_scram_hash(db_url, role_name):
    with psycopg.connect(db_url) as conn:
        create_app_role(conn, role_name, component="api", password="correct horse battery staple")
    verifier = stored_password(db_url, role_name)
    assert verifier.startswith("SCRAM-SHA-256$") and scram_verifies(verifier, "correct horse battery staple")
    assert not scram_verifies(verifier, "correct horse battery stapler")


def test_create_role_reads_the_password_from_a_file_without_its_newline(db_url, role_name, tmp_path, capsys):
    secret = tmp_path / "api-password"
    secret.write_text("from a file\n")
    assert create_role_command(role_name, "--for", "api", "--password-file", str(secret)) == 0
    assert scram_verifies(stored_password(db_url, role_name), "from a file")
    assert f"role {role_name} created for api" in capsys.readouterr().out


def test_create_role_reads_the_password_from_an_environment_variable(db_url, role_name, monkeypatch):
    monkeypatch.setenv("MY_ROLE_PASSWORD", "from the environment")
    assert create_role_command(role_name, "--for", "worker", "--password-env", "MY_ROLE_PASSWORD") == 0
    assert scram_verifies(stored_password(db_url, role_name), "from the environment")
    with pytest.raises(SystemExit, match="NOT_SET_ANYWHERE holds no password"):
        create_role_command(role_name, "--password-env", "NOT_SET_ANYWHERE", "--update-existing")


def test_create_role_asks_for_the_password_twice_on_a_terminal(db_url, role_name, monkeypatch):
    import getpass

    monkeypatch.setattr("sys.stdin", types.SimpleNamespace(isatty=lambda: True))
    answers = iter(["typed at the prompt", "typed at the prompt"])
    monkeypatch.setattr(getpass, "getpass", lambda prompt: next(answers))
    assert create_role_command(role_name, "--for", "api") == 0
    assert scram_verifies(stored_password(db_url, role_name), "typed at the prompt")
    answers = iter(["one", "another"])
    with pytest.raises(SystemExit, match="the two passwords differ"):
        create_role_command(role_name, "--update-existing")


def test_create_role_without_a_terminal_or_password_source_sets_none_and_says_what_public_allows(
        db_url, role_name, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", types.SimpleNamespace(isatty=lambda: False))  # a pipe, a CI job
    assert create_role_command(role_name, "--for", "api") == 0
    assert stored_password(db_url, role_name) is None
    out, err = capsys.readouterr()
    assert "no password" in out
    assert f"note: role {role_name} may still create temporary tables in this database and connect to" in err
    assert "--lock-down-public" in err
    with pytest.raises(RoleExists):
        create_role_command(role_name, "--for", "api")
    assert create_role_command(role_name, "--for", "worker", "--update-existing") == 0
    assert f"role {role_name} updated for worker" in capsys.readouterr().out


# ---------------------------------------------------------------- --lock-down-public, on a server of our own


@pytest.fixture(scope="module")
def own_server_url() -> Iterator[str]:
    """A migrated database on a PostgreSQL server of this module's own (the embedded one): the lock-down changes
    what PUBLIC may do on every database of the server, which the shared test server's other users rely on."""
    from outboxq.embedded import start_embedded

    url = start_embedded(os.path.join(tempfile.mkdtemp(prefix="outboxq-lockdown-"), "pgdata"),
                         cleanup_mode="delete")
    migrate.upgrade(url)
    return url


def test_lock_down_public_leaves_the_role_no_temporary_tables_and_no_other_database(own_server_url, monkeypatch,
                                                                                    capsys):
    from outboxq.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", own_server_url)
    get_settings.cache_clear()
    try:
        assert create_role_command("outboxq_locked", "--for", "worker", "--lock-down-public") == 0
    finally:
        get_settings.cache_clear()
    out, err = capsys.readouterr()
    assert "revoked from PUBLIC: TEMPORARY on this database, CONNECT on postgres, template1" in out
    assert "note:" not in err
    url = url_with_user(own_server_url, "outboxq_locked")
    with psycopg.connect(url) as conn:
        enqueue(conn, "mail", {})  # its own database, with its rights there
        conn.commit()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TEMP TABLE scratch (n int)")
    for other in ("postgres", "template1"):
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(url_with_database(url, other)).close()
    with psycopg.connect(own_server_url) as conn:
        assert not public_reach(conn, "outboxq_locked")

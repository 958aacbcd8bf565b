"""Helpers of the HTTP API tests: settings with known tokens, a TestClient on the real database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from fastapi.testclient import TestClient

from outboxq.api import create_app
from outboxq.settings import Settings

TOKENS = {"admin": "admin-secret-token", "read": "read-secret-token", "enqueue": "enqueue-secret-token",
          "enqueue+read": "writer-secret-token"}
TOKEN_SPEC = ",".join(f"{token}:{scope}" for scope, token in TOKENS.items())


def auth(scope: str = "admin") -> dict[str, str]:
    """The Authorization header of the test token with `scope`."""
    return {"Authorization": f"Bearer {TOKENS[scope]}"}


def api_settings(db_url: str, **overrides: Any) -> Settings:
    """Settings for an app on the test's database, with the test tokens and a fixed marker secret."""
    values: dict[str, Any] = {"database_url": db_url, "api_tokens": TOKEN_SPEC, "marker_secret": "test-secret",
                              "db_pool_min": 1, "db_pool_max": 8}
    values.update(overrides)
    values["DATABASE_URL"] = values.pop("database_url")  # the field is read through its alias
    return Settings(**values)


@contextmanager
def api_client(db_url: str, scope: str | None = "admin", *, raise_server_exceptions: bool = True,
               **overrides: Any) -> Iterator[TestClient]:
    """A TestClient (httpx) on create_app(), lifespan run, with the token of `scope` (None: no token)."""
    app = create_app(api_settings(db_url, **overrides))
    headers = auth(scope) if scope else {}
    with TestClient(app, headers=headers, raise_server_exceptions=raise_server_exceptions) as client:
        yield client


def count(db_url: str, statement: str, params: Any = None) -> int:
    """The integer the statement returns (on a fresh connection: what is committed)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(statement, params).fetchone()
    assert row is not None
    return int(row[0])


def job_count(db_url: str) -> int:
    """How many jobs are stored."""
    return count(db_url, "SELECT count(*) FROM outboxq_jobs")

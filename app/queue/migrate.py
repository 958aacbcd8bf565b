"""Apply alembic migrations, and check that a database's schema is the one this code needs."""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from psycopg.rows import tuple_row
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

import outboxq.migrations
from outboxq.db import one_row
from outboxq.errors import SchemaOutOfDate
from outboxq.queue import sql
from outboxq.queue.names import VERSION_TABLE
from outboxq.settings import get_settings

log = logging.getLogger("outboxq")

# The alembic scripts: the outboxq.migrations subpackage (the repository's migrations/ folder).
MIGRATIONS_DIR = Path(outboxq.migrations.__file__).resolve().parent


def alembic_config(url: str, schema: str | None = None) -> Config:
    """An alembic Config for the packaged migrations, bound to `url` and outboxq's schema."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = url
    config.attributes["schema"] = schema or get_settings().db_schema
    return config


@lru_cache(maxsize=1)
def head_revision() -> str:
    """The newest migration this code ships."""
    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None
    return head


def upgrade(url: str, schema: str | None = None) -> str:
    """Migrate outboxq's objects in the database at `url` (in `schema`, default OUTBOXQ_SCHEMA) to the newest
    revision; returns the revision."""
    command.upgrade(alembic_config(url, schema), "head")
    return head_revision()


def current_revision(url: str, schema: str | None = None) -> str | None:
    """The revision outboxq's objects in `schema` are at (None when never migrated)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return revision_on(conn, schema)


def revision_on(conn: psycopg.Connection, schema: str | None = None) -> str | None:
    """current_revision() on an open connection (the API's readiness check uses its pool)."""
    version_table = f'"{schema or get_settings().db_schema}".{VERSION_TABLE}'
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(sql.schema_version_exists, {"table": version_table})
        if not one_row(cur)[0]:
            return None
        cur.execute(sql.qualified(sql.schema_version_get, schema or get_settings().db_schema))
        row = cur.fetchone()
    return row[0] if row else None


def ensure_current(url: str, schema: str | None = None) -> None:
    """Raise SchemaOutOfDate, saying to run `outboxq migrate`, unless the schema is at head."""
    current = current_revision(url, schema)
    if current != head_revision():
        raise SchemaOutOfDate(
            f"the database schema is at {current or 'nothing (never migrated)'} but this outboxq needs "
            f"{head_revision()}: run `outboxq migrate` first"
        )


def wait_until_current(url: str, timeout_s: float, schema: str | None = None, *,
                       wait_for_migration: bool = True) -> None:
    """ensure_current(), tried again (backing off up to 2 s apart) for up to `timeout_s` while the database does not
    answer (it is starting or restarting) or, with `wait_for_migration`, is not migrated yet: a process started
    beside such a database waits for it instead of exiting. Raises the last error when it never was ready."""
    waiting = (psycopg.OperationalError, SchemaOutOfDate) if wait_for_migration else psycopg.OperationalError

    def say_once(state: RetryCallState) -> None:
        if state.attempt_number == 1 and state.outcome is not None:
            log.warning("waiting up to %.0f s for the database: %s", timeout_s, state.outcome.exception())

    for attempt in Retrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_exponential(multiplier=0.2, max=2.0),
        retry=retry_if_exception_type(waiting),
        before_sleep=say_once,
        reraise=True,
    ):
        with attempt:
            ensure_current(url, schema)

"""Apply alembic migrations, and check that a database's schema is the one this code needs."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import outboxq.migrations
import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from outboxq.errors import SchemaOutOfDate

# The alembic scripts: the outboxq.migrations subpackage (the repository's migrations/ folder).
MIGRATIONS_DIR = Path(outboxq.migrations.__file__).resolve().parent


def alembic_config(url: str) -> Config:
    """An alembic Config for the packaged migrations, bound to `url`."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = url
    return config


@lru_cache(maxsize=1)
def head_revision() -> str:
    """The newest migration this code ships."""
    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None
    return head


def upgrade(url: str) -> str:
    """Migrate the database at `url` to the newest schema; returns the revision."""
    command.upgrade(alembic_config(url), "head")
    return head_revision()


def current_revision(url: str) -> str | None:
    """The revision the database at `url` is at (None when it was never migrated)."""
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('alembic_version') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return None
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        return row[0] if row else None


def ensure_current(url: str) -> None:
    """Raise SchemaOutOfDate, saying to run `outboxq migrate`, unless the schema is at head."""
    current = current_revision(url)
    if current != head_revision():
        raise SchemaOutOfDate(
            f"the database schema is at {current or 'nothing (never migrated)'} but this outboxq needs "
            f"{head_revision()}: run `outboxq migrate` first"
        )

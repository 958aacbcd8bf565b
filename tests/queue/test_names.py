"""The names the SQL shares with the schema, kept apart so that a worker or a CLI call never loads SQLAlchemy."""

from __future__ import annotations

import subprocess
import sys

from outboxq.queue.names import TABLES
from outboxq.queue.schema import metadata


def test_the_shared_table_names_are_the_schemas_tables():
    assert sorted(TABLES) == sorted(metadata.tables)


def test_the_command_and_a_worker_start_without_sqlalchemy():
    probe = ("import sys, outboxq.cli, outboxq.workers.runner, outboxq.queue.sql; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

"""outboxq's own migration revision table (health and startup checks)."""

from __future__ import annotations

schema_version_exists = "SELECT to_regclass(%(table)s) IS NOT NULL"

schema_version_get = "SELECT version_num FROM outboxq_alembic_version"

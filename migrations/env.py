"""Alembic environment: migrations run online against the URL outboxq resolved (DATABASE_URL or embedded).

Every object goes into outboxq's schema (OUTBOXQ_SCHEMA, default public), and the revision is recorded in
outboxq's own version table there, so the application's own alembic history is never read or written.
"""

from alembic import context
from sqlalchemy import create_engine, pool

from outboxq.db import database_url, sqlalchemy_url
from outboxq.queue.schema import VERSION_TABLE, metadata
from outboxq.settings import get_settings

config = context.config
target_metadata = metadata


def run_migrations_online() -> None:
    """Run the migrations in one transaction on a fresh connection whose search_path is outboxq's schema."""
    url = config.attributes.get("database_url") or database_url()
    schema = config.attributes.get("schema") or get_settings().db_schema
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool,
                           connect_args={"options": f'-c search_path="{schema}"'})
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          version_table=VERSION_TABLE, version_table_schema=schema)
        with context.begin_transaction():
            connection.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("outboxq migrations run online only: set DATABASE_URL and run `outboxq migrate`")
run_migrations_online()

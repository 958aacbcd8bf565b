"""Alembic environment: migrations run online against the URL outboxq resolved (DATABASE_URL or embedded)."""

from alembic import context
from outboxq.db import database_url, sqlalchemy_url
from outboxq.queue.schema import metadata
from sqlalchemy import create_engine, pool

config = context.config
target_metadata = metadata


def run_migrations_online() -> None:
    """Run the migrations in one transaction on a fresh connection."""
    url = config.attributes.get("database_url") or database_url()
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("outboxq migrations run online only: set DATABASE_URL and run `outboxq migrate`")
run_migrations_online()

"""The shop's alembic environment: its own tables, its own alembic_version, DATABASE_URL."""

from alembic import context
from app.models import Base
from sqlalchemy import create_engine, pool

from app.db import database_url

config = context.config


def run_migrations_online() -> None:
    """Run the shop's migrations in one transaction."""
    engine = create_engine(database_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()

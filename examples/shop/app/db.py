"""The shop's database handles: one SQLAlchemy engine for sync routes, one async engine for async routes."""

from __future__ import annotations

import os
from functools import lru_cache

from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


def database_url() -> str:
    """The shop's database (DATABASE_URL), as a SQLAlchemy URL on the psycopg 3 driver."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise RuntimeError("set DATABASE_URL to the shop's PostgreSQL database (postgresql://...)")
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


@lru_cache(maxsize=1)
def engine() -> Engine:
    """The sync engine (created on first use)."""
    return create_engine(database_url(), pool_pre_ping=True)


@lru_cache(maxsize=1)
def async_engine() -> AsyncEngine:
    """The async engine (created on first use)."""
    return create_async_engine(database_url(), pool_pre_ping=True)

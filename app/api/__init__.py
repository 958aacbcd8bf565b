"""The HTTP service: `create_app(settings)` builds the whole FastAPI app (`outboxq serve`), `create_router(settings)`
the same API for someone else's FastAPI app."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi_offline import FastAPIOffline
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from outboxq.api import errors
from outboxq.api.auth import FailedAuthLimiter, parse_tokens
from outboxq.api.responses import install_docs_headers
from outboxq.api.routes import (
    admin,
    health,
    jobs,
    limits,
    metrics,
    queues,
    schedules,
    search,
    spark,
    stats,
    workers,
    workflows,
)
from outboxq.api.routing import ApiState
from outboxq.db import check_pooled_connection, database_url, pooled_connection_returned
from outboxq.queue.admin import HealthMonitor
from outboxq.settings import Settings, get_settings

log = logging.getLogger("outboxq.api")

POOL_TIMEOUT_S = 10.0


def create_router(settings: Settings | None = None) -> APIRouter:
    """outboxq's HTTP API and its dashboard as a router for your own FastAPI app: `app.include_router(
    create_router(), prefix="/outboxq")` serves the dashboard at /outboxq/ui/. Its lifespan opens its connection pool; its routes authenticate with outboxq's
    tokens, enforce its body limits and answer errors in its JSON shape, whatever the including app does."""
    settings = settings or get_settings()
    tokens = parse_tokens(settings.api_tokens)
    if not tokens:
        log.warning("no API tokens are configured: every route that needs a token answers 401")
    state = ApiState(
        settings=settings,
        tokens=tokens,
        marker_secret=settings.marker_secret.encode() if settings.marker_secret else None,
        health_monitor=HealthMonitor(healthy_allowed_error_time_s=settings.healthy_allowed_error_time_s,
                                     startup_grace_s=settings.health_startup_grace_s),
        auth_limiter=FailedAuthLimiter(settings.auth_max_failures, settings.auth_failure_window_s),
    )

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        pool = ConnectionPool(
            database_url(settings),
            min_size=settings.db_pool_min,
            max_size=max(settings.db_pool_max, settings.db_pool_min),
            kwargs={"row_factory": dict_row},
            check=check_pooled_connection,
            reset=pooled_connection_returned,
            timeout=POOL_TIMEOUT_S,
            name="outboxq-api",
            open=False,
        )
        pool.open(wait=False)  # the API starts even while the database is away: /readyz says 503
        state.pool = pool
        app.state.outboxq = state
        try:
            yield
        finally:
            pool.close()

    router = APIRouter(lifespan=lifespan)
    for module in (search, jobs, queues, limits, admin, stats, health, metrics, spark, workflows, workers,
                   schedules):
        router.include_router(module.router)
    from outboxq.ui import ui_router

    router.include_router(ui_router())  # the dashboard, at <prefix>/ui/
    return router


def create_app(settings: Settings | None = None) -> FastAPI:
    """The whole HTTP service (`outboxq serve`): outboxq's router, the dashboard, and outboxq's error shape
    for what no route answers (404, 405); the pool opens in the lifespan without waiting for the database."""
    # FastAPIOffline: a FastAPI whose /docs and /redoc load Swagger UI and ReDoc from the app itself (a
    # package's static files), not from a CDN: they work offline and send no visitor to a third party.
    app = FastAPIOffline(
        title="outboxq",
        version="0.1.0",
        description="A transactional-outbox job queue inside PostgreSQL. Errors answer "
                    '{"error": {"code": ..., "message": ...}}.',
    )
    errors.install(app)
    install_docs_headers(app)  # /docs, /redoc and /openapi.json send the dashboard's security headers
    app.include_router(create_router(settings))
    from outboxq import tracing

    tracing.instrument_app(app)  # request spans, when the otel extra is installed
    return app


__all__ = ["create_app", "create_router"]

"""The HTTP service: `create_app(settings)` builds the FastAPI app (tests use it; `outboxq serve` runs it)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from outboxq.api import errors
from outboxq.api.auth import parse_tokens
from outboxq.api.routes import admin, health, jobs, metrics, queues, spark, stats
from outboxq.db import database_url
from outboxq.queue.admin import HealthMonitor
from outboxq.settings import Settings, get_settings

log = logging.getLogger("outboxq.api")

POOL_TIMEOUT_S = 10.0
# Room for the envelope (key, depends_on, options) around a payload at the size limit.
REQUEST_OVERHEAD_BYTES = 256 * 1024


class BodySizeLimit:
    """Answer 413 to a request whose body is over the limit, before anything parses it."""

    def __init__(self, app: ASGIApp, limit_for: Any):
        self.app, self.limit_for = app, limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await self._too_large(send, limit)
            return
        # Without a trustworthy Content-Length (chunked), read the body up to the limit and replay it.
        if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
            chunks, size, more = [], 0, True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    break
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    await self._too_large(send, limit)
                    return
                chunks.append(chunk)
                more = message.get("more_body", False)
            body = b"".join(chunks)
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    async def _too_large(send: Send, limit: int) -> None:
        response = errors.error_json(413, "request_too_large",
                                     f"the request body is over {limit} bytes; send smaller payloads or batches")
        await response({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def create_app(settings: Settings | None = None) -> FastAPI:
    """The FastAPI app; its connection pool opens in the lifespan (without waiting for the database)."""
    settings = settings or get_settings()
    tokens = parse_tokens(settings.api_tokens)
    if not tokens:
        log.warning("no API tokens are configured: every route that needs a token answers 401")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = ConnectionPool(
            database_url(settings),
            min_size=settings.db_pool_min,
            max_size=max(settings.db_pool_max, settings.db_pool_min),
            kwargs={"row_factory": dict_row},
            check=ConnectionPool.check_connection,
            timeout=POOL_TIMEOUT_S,
            name="outboxq-api",
            open=False,
        )
        pool.open(wait=False)  # the API starts even while the database is away: /readyz says 503
        app.state.pool = pool
        try:
            yield
        finally:
            pool.close()

    app = FastAPI(
        title="outboxq",
        version="0.1.0",
        description="A transactional-outbox job queue inside PostgreSQL. Errors answer "
                    '{"error": {"code": ..., "message": ...}}.',
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.tokens = tokens
    app.state.marker_secret = (settings.marker_secret or secrets.token_hex(32)).encode()
    app.state.health_monitor = HealthMonitor(
        healthy_allowed_error_time_s=settings.healthy_allowed_error_time_s,
        startup_grace_s=settings.health_startup_grace_s,
    )
    errors.install(app)
    for module in (jobs, queues, admin, stats, health, metrics, spark):
        app.include_router(module.router)

    single = settings.max_payload_bytes + REQUEST_OVERHEAD_BYTES
    batch = max(single, settings.max_payload_bytes * 4 + REQUEST_OVERHEAD_BYTES, 32 * 1024 * 1024)
    app.add_middleware(BodySizeLimit, limit_for=lambda path: batch if path.endswith("/batch") else single)
    from outboxq.ui import mount_ui

    mount_ui(app)
    return app


__all__ = ["create_app"]

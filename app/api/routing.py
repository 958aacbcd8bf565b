"""What outboxq's routes carry with them, so that they work in outboxq's own app and in anyone else's:
the run-time state (one object on `app.state.outboxq`) and a route class that enforces the body limits and
answers every error in outboxq's JSON shape (the including app's exception handlers are not ours)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from psycopg_pool import ConnectionPool

from outboxq.api import errors
from outboxq.api.auth import FailedAuthLimiter, TokenEntry
from outboxq.db import loads_json
from outboxq.queue.admin import HealthMonitor
from outboxq.queue.secrets import MARKER_SECRET, shared_secret
from outboxq.settings import Settings

# Room for the envelope (key, depends_on, options) around a payload at the size limit.
REQUEST_OVERHEAD_BYTES = 256 * 1024


@dataclass
class ApiState:
    """The API's run-time state: settings, tokens, marker key, health monitor and (once opened) the pool."""

    settings: Settings
    tokens: list[TokenEntry]
    # OUTBOXQ_MARKER_SECRET, else the secret every API process shares through the database (read once).
    marker_secret: bytes | None
    health_monitor: HealthMonitor
    auth_limiter: FailedAuthLimiter
    pool: ConnectionPool | None = field(default=None)

    def marker_key(self, conn: Any) -> bytes:
        """The listing markers' HMAC key: the configured one, or the one kept in the database."""
        if self.marker_secret is None:
            self.marker_secret = shared_secret(conn, MARKER_SECRET)
        return self.marker_secret

    def body_limit(self, batch: bool) -> int:
        """The largest request body a route accepts (batch routes take several payloads)."""
        single = self.settings.max_payload_bytes + REQUEST_OVERHEAD_BYTES
        if not batch:
            return single
        return max(single, self.settings.max_payload_bytes * 4 + REQUEST_OVERHEAD_BYTES, 32 * 1024 * 1024)


def api_state(request: Request) -> ApiState:
    """The state of the outboxq API serving this request (set by the router's lifespan)."""
    return request.app.state.outboxq


class OutboxqRoute(APIRoute):
    """An APIRoute that refuses oversized bodies (413) before parsing and maps every error it raises."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, wrapped: body limit first, then outboxq's error mapping around it."""
        handle = super().get_route_handler()
        batch = self.path.endswith("/batch")
        # The query parameters this route declares (its dependencies' too): any other is a typo to point out,
        # not something to ignore (`?limt=5` would otherwise list 100).
        accepted = _query_parameters(self.dependant)

        async def handler(request: Request) -> Response:
            request = FastJsonRequest(request.scope, request.receive)
            try:
                unknown = sorted(set(request.query_params) - accepted)
                if unknown:
                    raise errors.ApiProblem(
                        422, "invalid_request", f"unknown query parameter {', '.join(map(repr, unknown[:5]))}: "
                        f"this route takes {', '.join(sorted(accepted)) or 'none'}")
                too_large = await _refuse_oversized_body(request, api_state(request).body_limit(batch))
                if too_large is not None:
                    return too_large
                return await handle(request)
            except Exception as exc:  # every error answers in outboxq's shape, whoever's app this is
                return errors.response_for(request, exc)

        return handler


class FastJsonRequest(Request):
    """A Request whose JSON body is parsed by orjson (outboxq.db.loads_json: what orjson would read otherwise or
    refuses goes to json.loads, so the values and the errors are json.loads' own): a 1,000-job batch's body
    took json.loads 1 ms, orjson 0.2 ms."""

    async def json(self) -> Any:
        """The body as JSON values."""
        if not hasattr(self, "_json"):
            self._json = loads_json(await self.body())
        return self._json


def _query_parameters(dependant: Any) -> set[str]:
    """The names of the query parameters a route (a FastAPI Dependant) and its dependencies declare."""
    names = {param.alias for param in dependant.query_params}
    for dependency in dependant.dependencies:
        names |= _query_parameters(dependency)
    return names


async def _refuse_oversized_body(request: Request, limit: int) -> Response | None:
    """A 413 response when the body is over `limit` bytes, read no further than that; else None."""
    length = request.headers.get("content-length")
    if length is not None:
        if length.isdigit() and int(length) <= limit:
            return None
        return _too_large(limit)
    if request.method not in ("POST", "PUT", "PATCH"):
        return None
    # Chunked: read up to the limit, then hand the body to FastAPI (Request.body() returns `_body` when set).
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return _too_large(limit)
        chunks.append(chunk)
    request._body = b"".join(chunks)
    return None


def _too_large(limit: int) -> Response:
    return errors.error_json(413, "request_too_large",
                             f"the request body is over {limit} bytes; send smaller payloads or batches")

"""The one place that maps errors to HTTP: every error answers {"error": {"code": ..., "message": ...}}."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
import psycopg_pool
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from outboxq import errors
from outboxq.api.schemas import KEY_PATTERN

log = logging.getLogger("outboxq.api")


class ApiProblem(Exception):
    """An HTTP error raised by the API layer itself (auth, size limits, unavailable features)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        self.status, self.code, self.message, self.headers = status, code, message, headers
        super().__init__(message)


class ErrorBody(BaseModel):
    """What went wrong, and what to fix."""

    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every error response has this shape."""

    error: ErrorBody


# The status of each core error; the first matching class in this order wins.
STATUS_BY_ERROR: list[tuple[type[Exception], int]] = [
    (errors.JobNotFound, 404),
    (errors.WorkflowNotFound, 404),
    (errors.ScheduleNotFound, 404),
    (errors.DuplicateJob, 409),
    (errors.InvalidTransition, 409),
    (errors.LeaseLost, 409),
    (errors.IdempotencyKeyReused, 409),
    (errors.InvalidMarker, 400),
    (errors.UnknownDependency, 422),
    (errors.InvalidPayload, 422),
    (errors.InvalidInput, 422),
    (errors.SchemaOutOfDate, 503),
    (errors.OutboxqError, 400),
]

_DESCRIPTIONS = {
    400: "Malformed request (for example, JSON that does not parse)",
    401: "No token, or an unknown one",
    403: "The token lacks the scope this route needs",
    404: "No such job",
    409: "Conflict: a duplicate key, a job in the wrong status, or an Idempotency-Key reused with another body",
    413: "The payload (or the request) is over the size limit",
    422: "Invalid input: the message names the field and says what to fix",
    429: "Too many wrong tokens from this address (a right token is still let through), or too many Spark "
         "batches submitted: wait Retry-After seconds",
    503: "The database is unavailable or its schema is not current",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses (422 and 503 are always listed: an unknown query parameter
    is refused, the database may be away; 429 with 401: a client that keeps sending wrong tokens is slowed
    down)."""
    listed = {*statuses, 422, 503, *((429,) if 401 in statuses else ())}
    return {s: {"model": ErrorResponse, "description": _DESCRIPTIONS[s]} for s in sorted(listed)}


def error_json(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON error response."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def status_of(exc: Exception) -> int:
    """The HTTP status of a core error."""
    return next(status for cls, status in STATUS_BY_ERROR if isinstance(exc, cls))


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        where, rest = parts[0], parts[1:]
        return f"{where} field {'.'.join(rest)!r}" if rest else f"the request {where}"
    return ".".join(parts) or "the request"


def _without_other_union_members(problems: Sequence[Any]) -> list[Any]:
    """The problems of a value that may be a string or an object (a workflow step's `after` entry), as those of the
    member its input is: pydantic reports the value against each member, under the member's name in the
    location (a NUL in a step's name was told as not matching a pattern and as not being an object)."""
    kept = []
    for p in problems:
        loc = tuple(p.get("loc", ()))
        if loc and loc[-1] == "constrained-str":
            if isinstance(p.get("input"), dict):
                continue  # (an object was sent: its own member's problems say what is wrong)
            p = {**p, "loc": loc[:-1]}
        elif p.get("type") == "model_type" and isinstance(p.get("input"), str) and any(
                tuple(q.get("loc", ()))[:-1] == loc[:-1] and tuple(q.get("loc", ()))[-1:] == ("constrained-str",)
                for q in problems):
            continue  # (a string was sent: the string member's problem says what is wrong)
        kept.append(p)
    return kept


def validation_message(exc: RequestValidationError) -> tuple[int, str, str]:
    """(status, code, message) for a request that failed validation."""
    problems = exc.errors()
    if any(p.get("type") == "json_invalid" for p in problems):
        detail = next(p for p in problems if p.get("type") == "json_invalid")
        reason = (detail.get("ctx") or {}).get("error", "it does not parse")
        return 400, "malformed_json", f"the request body is not valid JSON ({reason}); send a JSON object"
    problems = _without_other_union_members(problems)
    messages = []
    for p in problems[:5]:
        msg = str(p.get("msg", "is invalid"))
        if p.get("type") == "extra_forbidden":
            msg = "is not a known field; remove it"
        elif p.get("type") == "missing":
            msg = "is required"
        elif p.get("type") == "string_pattern_mismatch" and (p.get("ctx") or {}).get("pattern") == KEY_PATTERN:
            msg = "must not contain a NUL character (\\u0000); remove it"
        messages.append(f"{_field(p.get('loc', ()))} {msg}")
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return 422, "invalid_request", "; ".join(messages) + more


HTTP_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str:
    """Every method some route answers at the request's path (Starlette's 405 names only the first route's:
    GET /v1/spark/batches hid POST)."""
    # Ask each route whether it would take the path with each method (routes included from routers are
    # matched through their own matches(), whatever their structure).
    routes = request.app.router.routes
    return ", ".join(method for method in HTTP_METHODS
                     if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes))


def response_for(request: Request, exc: Exception) -> JSONResponse:
    """The error response of any exception a route raised: the one mapping, used by the app's exception
    handlers (create_app) and by the router's own route class (create_router in someone else's app)."""
    if isinstance(exc, ApiProblem):
        return error_json(exc.status, exc.code, exc.message, exc.headers)
    if isinstance(exc, errors.OutboxqError):
        return error_json(status_of(exc), exc.code, str(exc))
    if isinstance(exc, RequestValidationError):
        status, code, message = validation_message(exc)
        return error_json(status, code, message)
    if isinstance(exc, StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.url.path}; see /docs for the API"
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        return error_json(exc.status_code, code, message, headers)
    if isinstance(exc, psycopg.errors.DataError):
        # Values PostgreSQL cannot store (a NUL character in text, a number out of range...).
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return error_json(422, "invalid_input", f"the database rejected a value: {first_line}")
    if isinstance(exc, RecursionError):
        # JSON nested deeper than max_json_depth is refused before it is parsed; this is what a setting close to
        # the interpreter's recursion limit lets through.
        return error_json(422, "json_too_deep", "the request's JSON is nested too deeply; send a flatter payload")
    if isinstance(exc, UnicodeError):
        return error_json(422, "invalid_input", "a string holds characters that are not valid Unicode "
                                                "(for example a lone surrogate); send valid UTF-8")
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return error_json(503, "database_unavailable", "no database connection is available; retry later",
                          {"Retry-After": "1"})
    if isinstance(exc, psycopg.OperationalError):
        log.warning("database unavailable: %s", exc)
        return error_json(503, "database_unavailable", "the database is unavailable; retry later",
                          {"Retry-After": "1"})
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_json(500, "internal_error", "an unexpected error occurred; it has been logged")


# The exception classes the app-level handlers are registered for (response_for maps each).
HANDLED = (ApiProblem, errors.OutboxqError, RequestValidationError, StarletteHTTPException,
           psycopg.errors.DataError, RecursionError, UnicodeError, psycopg_pool.PoolTimeout, psycopg.OperationalError,
           Exception)


def install(app: FastAPI) -> None:
    """Register the exception handlers on `app` (create_app's own), and the security headers of its
    documentation pages, which no outboxq route serves."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return response_for(request, exc)

    for cls in HANDLED:
        app.add_exception_handler(cls, handle)

"""Dependencies shared by the routes: settings, the connection pool, one transaction per request."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

import psycopg
from fastapi import Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse
from psycopg_pool import ConnectionPool

from outboxq.api.responses import OrjsonResponse
from outboxq.api.routing import api_state
from outboxq.queue import idempotency, sql
from outboxq.queue.enqueue import QUEUE_NAME_PATTERN
from outboxq.settings import Settings


# The dependencies are async although they never wait: FastAPI runs a plain def dependency in the thread
# pool, one hop to a thread and back each, which cost more than the lookup.
async def get_settings_of_app(request: Request) -> Settings:
    """The settings the API was created with."""
    return api_state(request).settings


async def get_pool(request: Request) -> ConnectionPool:
    """The API's psycopg connection pool (opened in the router's lifespan)."""
    pool = api_state(request).pool
    assert pool is not None, "the outboxq router's lifespan has not run"
    return pool


SettingsDep = Annotated[Settings, Depends(get_settings_of_app)]
PoolDep = Annotated[ConnectionPool, Depends(get_pool)]

QueueName = Annotated[
    str,
    Path(pattern=f"^{QUEUE_NAME_PATTERN.pattern}$", description="1 to 128 characters from A-Z a-z 0-9 _ . : -"),
]
JobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The job's id")]


@contextmanager
def transaction(pool: ConnectionPool) -> Iterator[psycopg.Connection[Any]]:
    """A pooled connection in one transaction: committed when the block ends, rolled back when it raises."""
    with pool.connection() as conn:
        yield conn


def idempotent_write(
    request: Request,
    pool: ConnectionPool,
    principal_id: str,
    idempotency_key: str | None,
    request_body: Callable[[], Any],
    work: Callable[[psycopg.Connection[Any]], Any],
    status: int | Callable[[], int] = 201,
) -> JSONResponse:
    """Run `work` in one transaction, with the Idempotency-Key row (when given) written in the same one.

    `work` writes and returns the answer's content. The same key and body again answer 200 with the stored
    response and write nothing; the same key with another body is a 409. `request_body` gives the JSON of the
    request (called only when a key is given). `status` is the answer's status, or a function asked once `work`
    has run.
    """
    scope = f"{principal_id}:{request.method} {request.url.path}"
    body_hash = idempotency.request_hash(request_body()) if idempotency_key is not None else ""
    with transaction(pool) as conn:
        if idempotency_key is not None:
            stored = idempotency.begin(conn, scope, idempotency_key, body_hash)
            if stored is not None:
                return OrjsonResponse(stored.body, status_code=200)
        content = work(conn)  # made before the COMMIT: what raises here rolls the write back
        status = status() if callable(status) else status
        if idempotency_key is not None:
            idempotency.record(conn, scope, idempotency_key, body_hash, status, content)
            return OrjsonResponse(content, status_code=status)  # committed as the block ends
        # No record to write with the answer: the COMMIT goes out first, and the answer is rendered while the
        # server commits. A COMMIT that fails raises as the pipeline ends, before anything is answered.
        with conn.pipeline():
            conn.execute(sql.transaction_commit)
            response = OrjsonResponse(content, status_code=status)
    return response


Prefer = Annotated[
    str | None,
    Header(description='RFC 7240 preferences: "return=minimal" answers a batch with its jobs\' ids only (a '
                       "1,000-job batch: 20 kB instead of 400 kB)"),
]


def prefers_minimal(request: Request) -> bool:
    """Whether the request's Prefer headers (RFC 7240: preferences separated by commas, parameters by semicolons,
    every Prefer line counting, the first `return` preference winning) ask for return=minimal."""
    for line in request.headers.getlist("prefer"):
        for preference in line.split(","):
            name, _, value = preference.split(";", 1)[0].partition("=")
            if name.strip().lower() == "return":
                return value.strip().strip('"').lower() == "minimal"
    return False


IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", pattern=idempotency.KEY_PATTERN.pattern,
           description="Makes retries safe: the same key and body answer the first response again"),
]


# ?include=result on a listing: each job's result too (left out otherwise: a page of large results is large).
IncludeResult = Annotated[Literal["result"] | None, Query(
    description="result: each job's result too (left out otherwise: a page of large results is large; "
                "GET /v1/jobs/{id} has it)")]
